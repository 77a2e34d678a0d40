from .history import History, Positions
from .pipeline import LogitsPipeline, MinP, RepetitionPenalty, SuppressTokens, Temperature, TopK, TopP
from .processors import min_p, repetition_penalty, temperature, top_k, top_p
from .samplers import greedy, make_generator, sample

__all__ = [
    "History", "LogitsPipeline", "MinP", "Positions", "RepetitionPenalty", "SuppressTokens", "Temperature", "TopK",
    "TopP", "greedy", "make_generator", "min_p", "repetition_penalty", "sample", "temperature", "top_k", "top_p",
]
