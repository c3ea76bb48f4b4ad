"""The parameter servers under their dist-keras import path.

A thin face of dist-keras's names: the servers live in
`distkeras.transport.parameter_servers` (see there, with the servers dist-keras did not
have).
"""

from distkeras.transport.parameter_servers import (ADAGParameterServer, DeltaParameterServer,
                                                   DynSGDParameterServer,
                                                   ExperimentalParameterServer,
                                                   ParameterServer, SocketParameterServer)

__all__ = ["ParameterServer", "SocketParameterServer", "DeltaParameterServer",
           "ADAGParameterServer", "DynSGDParameterServer", "ExperimentalParameterServer"]
