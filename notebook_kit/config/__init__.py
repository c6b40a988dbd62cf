"""Settings as plain data, and facts about the machine they are resolved against.

Holds :class:`LaunchConfig` (what the user asks for), :class:`LaunchPlan` (what one launch
resolved it to), the argument checks, the environment report and the node placement read
from a batch scheduler's variables.

Runs anywhere: the kernel, a worker, a script. Imports nothing from the other subpackages, so
every layer above may read it.
"""
