"""transferset: build a transfer set, score it once with a teacher, train small students."""

__version__ = "0.1.0"
