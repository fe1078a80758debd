"""What runs inside the sandboxed harness processes: child.py and the modules it loads by path.

The sandbox shows this folder (read-only, at /judge) and nothing else of mkb. wire.py is shared
with the referee, which imports it from here.
"""
