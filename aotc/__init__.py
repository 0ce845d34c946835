"""aotc: an ahead-of-time compiler for trained neural networks."""

__version__ = "0.1.0"
