"""`triton_python_backend_utils`: the module a Triton Python model imports.

The backend registers this module under the name `triton_python_backend_utils`
before it imports a model, so `import triton_python_backend_utils as pb_utils`
finds it in the server process (thread mode) and in a model's worker process
alike. Every class a model sees is defined once, in one of the modules below,
by concern, and is this module's attribute under the same name:

- `api_core`: Triton's constants, the datatype table, BYTES framing, errors, the host;
- `api_messages`: `Tensor`, `InferenceRequest`, `InferenceResponse`, response senders
  and iterators;
- `api_config`: lookups by name and the auto-complete `ModelConfig`;
- `api_server_calls`: `Logger`, custom metrics and model control.

What needs the server (BLS, response senders, custom metrics, model control)
goes through a *host*: the object the backend installs for the model code it
runs (`_use_host`). A model never sees the host; it calls the API below.
"""

from __future__ import annotations

from .api_config import *  # noqa: F401,F403
from .api_config import _config_entry  # noqa: F401
from .api_core import *  # noqa: F401,F403
from .api_core import (_CODE_BY_V2, _HOST, _LENGTH, _NUMPY_BY_CODE, _TYPES,  # noqa: F401
                       _V2_BY_NUMPY, _as_object_bytes, _current_host, _NoHost, _use_host,
                       _v2_datatype)
from .api_messages import *  # noqa: F401,F403
from .api_messages import _DLPackCapsule, _parameters_json, _ResponseQueue  # noqa: F401
from .api_server_calls import *  # noqa: F401,F403
from .api_server_calls import _log  # noqa: F401
