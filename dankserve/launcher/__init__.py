"""The pre-imported vLLM launcher: runs where vLLM runs and starts `vllm serve` servers on request.

Standard library only, Python 3.10+: it runs in the image's own Python beside vLLM (mounted
read-only into the container) or in the process runtime's Python, never in dankserve's. Nothing
here may import dankserve outside this package; inside it, imports are relative so the package
works under any name (`dankserve.launcher` on the host, a bare directory in the container).

- `protocol`: the socket's JSON-lines messages and the log markers around each server's lines.
- `forking`: pure: whether a server may be forked from the pre-imported vLLM, or needs a plain boot.
- `children`: its child processes: the zygote (vLLM pre-imported, forking servers; `ZygoteLink` is the
  launcher's side of it) and plain boots.
- `service`: the launcher process itself (socket, requests, the server's lifetime, exit reports).

See docs/launcher.md.
"""
