"""chat.json formats: loading one, rendering with it, reading its replies (docs/CHATJSON.md).

``load`` validates a chat.json against the vocabulary; ``format`` is the loaded
``ChatJsonFormat`` (a ``ChatFormat``); ``reply`` its reply reader; ``k2tools`` the Kimi K2 tool
protocol a format may carry.
"""
