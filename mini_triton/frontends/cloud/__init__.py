"""The cloud platforms' serving contracts, each its own HTTP port on our HTTP/1.1 server:
SageMaker (`sagemaker.py`: /ping, /invocations, multi-model endpoints) and Vertex AI
(`vertex_ai.py`: its health and predict routes). Both hand inference to the v2 REST
front end's `HttpFrontend` (`../kserve_rest/server.py`) and answer in their platform's
status codes."""
