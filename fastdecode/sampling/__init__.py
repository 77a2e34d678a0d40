from .processors import min_p, repetition_penalty, temperature, top_k, top_p
from .samplers import greedy, make_generator, sample

__all__ = ["greedy", "make_generator", "min_p", "repetition_penalty", "sample", "temperature", "top_k", "top_p"]
