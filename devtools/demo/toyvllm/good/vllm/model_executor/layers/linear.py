from vllm.distributed import get_tensor_model_parallel_world_size


def divide(numerator, denominator):
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


class LinearBase:
    def __init__(self, input_size, output_size, quant_config=None, prefix=""):
        self.input_size = input_size
        self.output_size = output_size
        self.prefix = prefix
        self.quant_method = quant_config.get_quant_method(self, prefix) if quant_config else "unquantized"

    def num_parameters(self):
        return self.input_size * self.output_size_per_partition


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size, output_size, quant_config=None, prefix=""):
        super().__init__(input_size, output_size, quant_config, prefix)
        self.output_size_per_partition = output_size


class ColumnParallelLinear(LinearBase):
    def __init__(self, input_size, output_size, quant_config=None, prefix=""):
        super().__init__(input_size, output_size, quant_config, prefix)
        self.output_size_per_partition = divide(output_size, get_tensor_model_parallel_world_size())


class RowParallelLinear(LinearBase):
    def __init__(self, input_size, output_size, quant_config=None, prefix=""):
        super().__init__(input_size, output_size, quant_config, prefix)
        self.input_size_per_partition = divide(input_size, get_tensor_model_parallel_world_size())
        self.output_size_per_partition = output_size
