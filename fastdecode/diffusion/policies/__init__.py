"""One file per `dlm.*` method: its config (a frozen dataclass with the paper's defaults) and its policy."""
