"""--frontend-processes N: N processes do the protocol work on the same ports, and the
main process keeps the one service, with one scheduler per model.

- `link.py`: the messages between a front-end process and the main process, and how
  requests, responses and errors travel (over core/link: a socket pair and shared memory).
- `host.py`: the main process's end of one front-end process.
- `remote_service.py`: the service as a front-end process's front ends see it.
- `supervisor.py`: starts the front-end processes, replaces one that dies, stops them.
- `child.py`: a front-end process's `main`.
"""
