"""The image family: data, training and methods for class-conditional image AR models (docs/image.md).

The image model itself (token layout, codecs, guidance) is core (`models/image.py`, `models/guided.py`), so that
every family's driver decodes it; this package holds what only images need: the digit data sets (`data.py`), the
VQ tokenizer's and the teacher's training, and the image-specific methods, which register themselves on import
(`plugins.load`).
"""
