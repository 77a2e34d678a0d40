"""Reference methods from transformers' own `generate()`, so ours are compared with what users would
otherwise pick, on the same prompts and in the same run. The registry imports every module here (`hf.*`)."""
