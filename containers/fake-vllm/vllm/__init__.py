"""The stand-in's `vllm` package: only the modules dankserve's launcher imports from vLLM (its default entry
`vllm.entrypoints.cli.main:main` and pre-import `vllm.entrypoints.openai.api_server`, dankserve/launcher/
service.py), so that `launcher = "auto"` boots the stand-in image as it boots vllm/vllm-openai, with no
launcher settings of its own. The `vllm` script (vllm.py) is the stand-in's CLI as before."""

from fake_vllm import VLLM_VERSION

__version__ = VLLM_VERSION
