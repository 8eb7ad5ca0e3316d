"""The Hugging Face Hub side of dankserve: model facts and weights, through `huggingface_hub`.

`access` (where the Hub and the cache are, the token: pure over settings and env), `cache`
(the HF cache read through huggingface_hub), `remote` (facts over the network, cached under the
state dir), `download` (pure decisions: which files, disk fit, progress) and `pull` (the
downloads themselves).
"""
