"""Decoupled: execute hands the stream to a thread and returns at once."""

import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            threading.Thread(target=self._stream, daemon=True,
                             args=(request.get_response_sender(), text)).start()
        return None

    def _stream(self, sender, text):
        for _ in range(3):
            time.sleep(0.3)
            sender.send(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("text_output", text)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
