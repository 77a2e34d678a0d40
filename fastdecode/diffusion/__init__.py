"""Masked-diffusion decoding (LLaDA-style canvases). The registry imports every module here (`dlm.*`)."""
