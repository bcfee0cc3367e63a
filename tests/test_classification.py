"""The classification extension's formatting, with and without labels."""

import numpy as np
import pytest

from mini_triton.core.classification import classify
from mini_triton.core.errors import TritonError
from mini_triton.core.tensor import Tensor


def test_top_k_per_batch_row_with_labels():
    tensor = Tensor.from_array("OUT", np.array([[1, 5, 3], [9, 0, 2]], dtype=np.int32))
    result = classify(tensor, 2, ["cat", "dog"], batched=True)
    assert result.datatype == "BYTES" and result.shape == (2, 2)
    assert result.data.tolist() == [[b"5.000000:1:dog", b"3.000000:2"],
                                    [b"9.000000:0:cat", b"2.000000:2"]]


def test_k_larger_than_classes_and_unbatched():
    tensor = Tensor.from_array("OUT", np.array([0.5, 0.25], dtype=np.float32))
    result = classify(tensor, 5, [], batched=False)
    assert result.shape == (2,)
    assert result.data.tolist() == [b"0.500000:0", b"0.250000:1"]


def test_string_outputs_cannot_be_classified():
    tensor = Tensor("OUT", "BYTES", (1,), np.array([b"x"], dtype=object))
    with pytest.raises(TritonError, match="unsupported type 'BYTES'"):
        classify(tensor, 1, [], batched=False)
