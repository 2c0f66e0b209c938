"""Types of the native module (Rust, PyO3) behind ``idempotent_retry``'s transports."""

from typing import Callable, List, Optional, Sequence, Tuple, Union, final

__all__ = [
    "Engine",
    "Answer",
    "Pending",
    "ResponseBody",
    "BodyStream",
    "derive",
    "for_tool_call",
]

def derive(scope: str, parts: Sequence[str] = ...) -> str:
    """``IdempotencyKey::derive(scope, parts)``: 64 lowercase hex digits."""

def for_tool_call(tool: str, args_json: str) -> str:
    """``IdempotencyKey::for_tool_call(tool, args)`` over JSON text; ``ValueError`` if it is
    not JSON."""

@final
class BodyStream:
    """A request body pushed from Python, read once by one request."""

    def __init__(self) -> None: ...
    def push(self, chunk: bytes) -> None:
        """Adds a chunk; ``RuntimeError`` once finished or failed."""
    def finish(self) -> None:
        """Ends the body."""
    def fail(self, message: str) -> None:
        """Ends the body with an error: the request fails."""

@final
class ResponseBody:
    """The rest of a streamed response body."""

    def read_chunk(self) -> Optional[bytes]:
        """The next chunk (``None`` at the end), the GIL released; ``OSError`` if cut off."""
    def start_read(self, done: Callable[[Optional[bytes], Optional[str]], None]) -> None:
        """Reads the next chunk on the runtime; ``done(chunk, error)`` from a runtime thread."""
    def close(self) -> None:
        """Drops the rest of the body."""

@final
class Answer:
    """How one operation ended: a response (``status`` set) or a failure (``error_kind``
    set), with the report."""

    status: Optional[int]
    headers: List[Tuple[bytes, bytes]]
    body: Optional[bytes]
    rest: Optional[ResponseBody]
    http_version: str
    attempts: int
    key: Optional[str]
    replayed: bool
    url: Optional[str]
    elapsed: float
    lease_wait: float
    unrecorded: Optional[str]
    in_progress_waits: int
    in_progress_wait: float
    refetched: bool
    error_status: Optional[int]
    outcome: str
    error_kind: Optional[str]
    failure: Optional[str]
    message: Optional[str]
    history: List[Tuple[int, float, Optional[int], Optional[str], Optional[float]]]

@final
class Pending:
    """An operation started by ``Engine.start``."""

    def cancel(self) -> None:
        """Drops the operation where it stands; ``done`` is never called."""

@final
class Engine:
    """An ``idempotent_retry::Client`` on the shared runtime."""

    def __new__(
        cls,
        *,
        max_attempts: Optional[int] = None,
        base_delay: Optional[float] = None,
        max_delay: Optional[float] = None,
        attempt_timeout: Optional[float] = None,
        reconcile_window: Optional[float] = None,
        max_retry_after: Optional[float] = None,
        key_header: Optional[str] = None,
        ledger: Optional[str] = None,
        lease: Optional[float] = None,
        lease_wait: Optional[float] = None,
        worker: Optional[str] = None,
        ledger_scope: Optional[str] = None,
        retry_budget: bool = True,
        budget_capacity: Optional[int] = None,
        budget_retry_cost: Optional[int] = None,
        budget_timeout_cost: Optional[int] = None,
        budget_success_reward: Optional[int] = None,
        verify: bool = True,
        ca_file: Optional[str] = None,
        cert_file: Optional[str] = None,
        key_file: Optional[str] = None,
        proxy: Optional[str] = None,
        answer_read_limit: Optional[int] = None,
        max_in_progress_wait: Optional[float] = None,
        max_saved_body: Optional[int] = None,
        fetch_unsaved_answers: bool = True,
        allow_key_to: Optional[Sequence[str]] = None,
        seal_keys: Optional[Sequence[str]] = None,
        keep_query_params: Optional[Sequence[str]] = None,
    ) -> Engine: ...
    @property
    def key_header(self) -> str:
        """The key header's name, lowercase."""
    def redirect_keeps_key(self, original: str, location: str) -> bool:
        """Whether a redirect of an operation first sent to ``original`` may take its key to
        ``location``; ``ValueError`` unless both are absolute URLs."""
    def send(
        self,
        method: str,
        url: str,
        headers: Sequence[Tuple[bytes, bytes]],
        body: Union[bytes, BodyStream, None] = None,
        key: Optional[str] = None,
        timeout: Optional[float] = None,
        keyless: bool = False,
        after: Optional[Sequence[Tuple[int, str]]] = None,
    ) -> Answer:
        """Sends one operation, the GIL released until it ends."""
    def start(
        self,
        method: str,
        url: str,
        headers: Sequence[Tuple[bytes, bytes]],
        done: Callable[[Answer], None],
        body: Union[bytes, BodyStream, None] = None,
        key: Optional[str] = None,
        timeout: Optional[float] = None,
        keyless: bool = False,
        after: Optional[Sequence[Tuple[int, str]]] = None,
    ) -> Pending:
        """Starts one operation; ``done(answer)`` is called from a runtime thread."""
    def close(self) -> None:
        """Closes the ledger, if any."""
