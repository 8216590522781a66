def wait_for_engine_startup(proc, conn, timeout_s):
    """Wait for EngineCore's READY; raise like vLLM when it died instead."""
    ready = conn.poll(timeout_s)
    message = None
    if ready:
        try:
            message = conn.recv()
        except EOFError:
            message = None
    if message != "READY":
        proc.join(timeout=10)
        failed = {proc.name: proc.exitcode}
        raise RuntimeError("Engine core initialization failed. See root cause above. "
                           f"Failed core proc(s): {failed}")
