"""Protocol-neutral core: datatypes, tensors, requests, errors and validation."""
