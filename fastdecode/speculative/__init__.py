"""Speculative decoding: drafters propose, the target verifies in one forward. Read `drafter.py` first (the
contract every method implements), then `driver.py` (the one loop). The registry imports every module here; each
file in `drafters/` registers one `spec.*` method."""
