"""`attnlab bench`: the platform's speed and memory against reference implementations, in one run.

Absolute numbers drift between machines, so every result is paired with a reference measured
in the same process, interleaved step by step, and quoted as a ratio.
"""
