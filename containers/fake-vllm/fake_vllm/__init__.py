"""A stand-in for the `vllm/vllm-openai` 0.33 server, faithful at the process boundary.

It parses `vllm serve` argv from a flag catalogue generated from the vLLM 0.33 wheel, prints
0.33's boot log line shapes with phase durations scaled from real H200 measurements, writes and
reuses a torch.compile cache directory, serves the OpenAI-style endpoints, and fails on request
with vLLM's own error lines. Pure standard library: it runs in a Debian image with only python3.
"""

import os

VLLM_VERSION = os.environ.get("FAKE_VLLM_VERSION", "").strip() or "0.33.0"
"""The release it claims to be (`--version`, its log, /version, the compile cache's key):
FAKE_VLLM_VERSION stands in for another build of the image (an upgrade's new release): what it
speaks at the HTTP boundary follows the release (releases.py), its flags are 0.34's from 0.34 on,
0.33's before."""
