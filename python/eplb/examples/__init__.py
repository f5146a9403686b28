"""Runnable examples of eplb (torch needed): ``python -m eplb.examples.toy_moe``."""
