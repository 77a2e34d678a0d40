"""Speculative decoding: drafters propose, the target verifies in one forward. The registry imports every module
here; each file in `drafters/` registers one `spec.*` method."""
