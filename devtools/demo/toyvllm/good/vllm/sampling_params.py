class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=16, seed=None,
                 **kwargs):
        self.n = n
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.max_tokens = max_tokens
        self.seed = seed

    def __repr__(self):
        return f"SamplingParams(n={self.n}, temperature={self.temperature}, max_tokens={self.max_tokens})"
