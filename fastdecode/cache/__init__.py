from .base import CacheBase
from .kv import DynamicKVCache, KVCache

__all__ = ["CacheBase", "DynamicKVCache", "KVCache"]
