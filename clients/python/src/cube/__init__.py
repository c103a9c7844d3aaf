"""cube: a Python client for cubed, the durable 3-D coordinate store.

Written from docs/protocol.md alone (standard library only; NumPy is needed
only for the array functions)::

    import cube

    with cube.Client() as c:                 # $CUBE_SOCKET or ./cube-data/cubed.sock
        c.put("default", (1, 2, 3), b"hello")  # durable when it returns
        c.get("default", (1, 2, 3))            # b'hello'
        box = c.read_box("default", (0, 0, 0), (63, 63, 63), "float32", fill=0.0)

See help(cube.Client) for every command, and help(cube.arrays) for boxes as
NumPy arrays.
"""

__version__ = "0.1.0"

from .client import DEFAULT_SOCKET_PATH, SOCKET_ENV_VAR, Client, Pipeline, Watch, default_socket_path  # noqa: E402
from .errors import *  # noqa: E402,F401,F403
from .errors import ERROR_CODES, CubeError, ServerError  # noqa: E402
from .types import *  # noqa: E402,F401,F403
from .types import Link, Prog, Put  # noqa: E402

__all__ = [
    "Client",
    "Pipeline",
    "Watch",
    "DEFAULT_SOCKET_PATH",
    "SOCKET_ENV_VAR",
    "default_socket_path",
    "CubeError",
    "ServerError",
    "ERROR_CODES",
    "Put",
    "Link",
    "Prog",
    "__version__",
]
