import multiprocessing
import signal
import sys
from multiprocessing.connection import wait

from vllm import envs
from vllm.logger import init_logger
from vllm.utils.system_utils import decorate_logs, exit_with_parent

logger = init_logger(__name__)


class WorkerProcHandle:
    def __init__(self, proc, rank, ready_pipe, rpc_conn):
        self.proc = proc
        self.rank = rank
        self.ready_pipe = ready_pipe
        self.rpc_conn = rpc_conn


class MultiprocExecutor:
    """One worker process per tensor-parallel rank."""

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.world_size = vllm_config.parallel_config.world_size
        ctx = multiprocessing.get_context(envs.VLLM_WORKER_MULTIPROC_METHOD)
        self.workers = []
        sys.stdout.flush()
        sys.stderr.flush()
        for rank in range(self.world_size):
            reader, writer = ctx.Pipe(duplex=False)
            parent_conn, child_conn = ctx.Pipe()
            proc = ctx.Process(target=WorkerProc.worker_main, name=f"VllmWorker-{rank}",
                               kwargs=dict(vllm_config=vllm_config, local_rank=rank, rank=rank,
                                           ready_pipe=writer, rpc_conn=child_conn),
                               daemon=True)
            proc.start()
            writer.close()
            child_conn.close()
            self.workers.append(WorkerProcHandle(proc, rank, reader, parent_conn))
        self.wait_for_ready()

    def wait_for_ready(self):
        pending = {w.ready_pipe: w for w in self.workers}
        while pending:
            for conn in wait(list(pending), timeout=envs.VLLM_ENGINE_READY_TIMEOUT_S) or []:
                handle = pending.pop(conn)
                try:
                    message = conn.recv()
                except EOFError:
                    message = None
                if not message or message.get("status") != "READY":
                    self.shutdown(graceful=False)
                    raise Exception("WorkerProc initialization failed due to an exception in a "
                                    "background process. See stack trace for root cause.")

    def collective_rpc(self, method, *args):
        for w in self.workers:
            w.rpc_conn.send((method, args))
        return [w.rpc_conn.recv() for w in self.workers]

    def shutdown(self, graceful=True):
        if graceful:
            for w in self.workers:
                try:
                    w.rpc_conn.send(("shutdown", ()))
                except (BrokenPipeError, OSError):
                    pass
            for w in self.workers:
                w.proc.join(timeout=5)
        for w in self.workers:
            if w.proc.is_alive():
                w.proc.terminate()
        for w in self.workers:
            w.proc.join(timeout=5)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=5)


class WorkerProc:
    def __init__(self, vllm_config, local_rank, rank):
        from vllm.distributed.parallel_state import init_model_parallel
        from vllm.v1.worker.gpu_worker import Worker

        init_model_parallel(rank, vllm_config.parallel_config.world_size)
        self.rank = rank
        self.worker = Worker(vllm_config, local_rank, rank)
        self.worker.init_device()
        self.worker.load_model()

    def worker_busy_loop(self, conn):
        while True:
            method, args = conn.recv()
            if method == "shutdown":
                return
            conn.send(getattr(self.worker, method)(*args))

    @staticmethod
    def worker_main(vllm_config, local_rank, rank, ready_pipe, rpc_conn):
        shutdown_requested = False

        def signal_handler(signum, frame):
            nonlocal shutdown_requested
            if not shutdown_requested:
                shutdown_requested = True
                raise SystemExit()

        signal.signal(signal.SIGTERM, signal_handler)
        signal.signal(signal.SIGINT, signal_handler)
        decorate_logs(f"Worker_TP{rank}")
        exit_with_parent()
        worker = None
        try:
            worker = WorkerProc(vllm_config, local_rank, rank)
            ready_pipe.send({"status": "READY"})
            ready_pipe.close()
            ready_pipe = None
            worker.worker_busy_loop(rpc_conn)
        except Exception:
            if ready_pipe is not None:
                logger.exception("WorkerProc failed to start.")
            elif shutdown_requested:
                logger.info("WorkerProc shutting down.")
            else:
                logger.exception("WorkerProc failed.")
            shutdown_requested = True
            sys.stdout.flush()
            sys.exit(1)
        except SystemExit:
            logger.warning("WorkerProc was terminated")
            raise
        finally:
            if ready_pipe is not None:
                ready_pipe.close()
