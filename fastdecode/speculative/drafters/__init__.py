"""Drafters, one file per method; importing a file registers its `spec.*` method."""
