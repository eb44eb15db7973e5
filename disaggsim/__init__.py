"""disaggsim: discrete-event simulation of disaggregated vs colocated LLM serving."""

__version__ = "0.1.0"
