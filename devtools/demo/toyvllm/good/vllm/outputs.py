class CompletionOutput:
    def __init__(self, index, text, token_ids):
        self.index = index
        self.text = text
        self.token_ids = token_ids


class RequestOutput:
    def __init__(self, request_id, prompt, outputs):
        self.request_id = request_id
        self.prompt = prompt
        self.outputs = outputs
        self.finished = True
