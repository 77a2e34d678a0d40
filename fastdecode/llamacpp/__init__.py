"""llama.cpp as a reference runtime (`llamacpp.*`): the same weights converted to GGUF, run by llama-cpp-python.

An optional extra (`pip install 'fastdecode[llamacpp]'`): the methods register always and say how to install it when
it is missing. They are references to compare against, like `hf.*`, not fastdecode's own decoding.
"""
