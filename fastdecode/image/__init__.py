"""Class-conditional image generation (issue #33). Interim package file of the img-eval branch: img-core's
version replaces it at merge."""
