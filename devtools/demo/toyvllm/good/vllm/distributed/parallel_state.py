_TP_RANK = 0
_TP_SIZE = 1


def init_model_parallel(rank, world_size):
    global _TP_RANK, _TP_SIZE
    _TP_RANK, _TP_SIZE = rank, world_size


def get_tensor_model_parallel_rank():
    return _TP_RANK


def get_tensor_model_parallel_world_size():
    return _TP_SIZE
