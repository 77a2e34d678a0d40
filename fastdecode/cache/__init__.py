from .kv import DynamicKVCache, KVCache

__all__ = ["DynamicKVCache", "KVCache"]
