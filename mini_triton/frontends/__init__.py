"""Wire protocols: each codec is pure translation, each server is routing and status mapping."""
