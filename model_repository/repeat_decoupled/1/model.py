"""repeat_decoupled: stream each element of IN back as its own response, then the final flag."""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(
                "model '{}' needs the decoupled transaction policy".format(args["model_name"]))
        self.lock = threading.Lock()
        self.threads = set()

    def execute(self, requests):
        # Each request is answered from a thread of its own, so execute returns at once
        # and the next requests start while earlier ones are still streaming.
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
            delays = delay.as_numpy() if delay is not None else np.zeros(len(values), np.uint32)
            if len(delays) != len(values):
                raise pb_utils.TritonModelException("IN and DELAY must have the same length")
            thread = threading.Thread(target=self.repeat,
                                      args=(request.get_response_sender(), values, delays))
            with self.lock:
                self.threads.add(thread)
            thread.start()
        return None

    def repeat(self, sender, values, delays):
        try:
            for index, (value, delay) in enumerate(zip(values, delays)):
                time.sleep(int(delay) / 1000.0)
                if sender.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([value], np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], np.uint32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join()
