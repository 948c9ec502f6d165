"""Former home of :class:`~onlinefa.OnlineEM` and :class:`~onlinefa.OnlineSGA` (now :mod:`onlinefa.streaming`).

Pickles written by earlier versions name this module; it stays so that they still load.
"""

from .streaming import OnlineEM, OnlineSGA

__all__ = ["OnlineEM", "OnlineSGA"]
