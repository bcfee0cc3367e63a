"""The OpenAI-compatible /v1 routes on the HTTP port (`routes.py`): chat and text
completions and the model list. `codec.py` translates an OpenAI request into the model's
requests and its responses back (pure translation); `chat_template.py` finds a model's
chat template and applies it to the messages. They reuse the v2 REST codecs
(`../kserve_rest/`) and run on our HTTP/1.1 server (`../http1/`)."""
