"""Reference methods from transformers' own `generate()`, so ours are compared with what users would
otherwise pick, on the same prompts and in the same run. Importing registers `hf.*`."""

from . import assisted, greedy, prompt_lookup  # noqa: F401
