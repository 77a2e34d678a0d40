"""Autoregressive baselines: one target forward per token. The registry imports every module here (`ar.*`)."""
