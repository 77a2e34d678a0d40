from .kv import KVCache

__all__ = ["KVCache"]
