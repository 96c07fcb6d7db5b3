"""The Tocsin console: a browser page over the public API, served by `tocsin serve` (over
the embedded runtime) and by `tocsin console` (over a deployed stack, each call signed with
SigV4 here, so the browser never holds credentials).

What the browser loads ships in this package (`assets/`): one page, its script and its
style, no build step and no third-party origin. Every request passes `guard.Guard` first:
loopback only, its own Host and Origin, and against a stack a random token.
"""
