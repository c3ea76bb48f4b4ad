"""The parameter servers under their dist-keras import path.

A thin face: the names live in `distkeras.transport.parameter_servers` (see there).
"""

from distkeras.transport.parameter_servers import (RefusedUpdate, ParameterServer,
                                                   SocketParameterServer, HistoryServer,
                                                   AlgorithmServer, DeltaParameterServer,
                                                   ADAGParameterServer,
                                                   DynSGDParameterServer,
                                                   ExperimentalParameterServer,
                                                   AveragingServer, EpochServer)

__all__ = ["RefusedUpdate", "ParameterServer", "SocketParameterServer", "HistoryServer",
           "AlgorithmServer", "DeltaParameterServer", "ADAGParameterServer",
           "DynSGDParameterServer", "ExperimentalParameterServer", "AveragingServer",
           "EpochServer"]
