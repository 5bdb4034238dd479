"""Rows of a fetch source as a stream: from the HF hub through ``datasets`` (streaming, so nothing is
downloaded ahead of what is read), or from a local copy laid out like the hub (``--from-dir DIR``:
``DIR/<hub id>/`` holds the repository's files, as ``hf download <id> --repo-type dataset --local-dir
DIR/<id>`` writes them, so the repository's configs and data files resolve the same way offline).

A source with several configs is read interleaved (one row of each in turn, each to its end), so a
budget smaller than the whole takes from every config. The stream's position is datasets' own
``IterableDataset.state_dict()``, which the fetch saves and resumes from.

Stack-Edu publishes only the Software Heritage ids of its files; their text comes from Software
Heritage's S3 bucket (``software_heritage_text``), as the dataset card says.
"""
from __future__ import annotations

import functools
import gzip
from pathlib import Path

from infir.data.fetch_spec import FetchSource

SWH_BUCKET = "softwareheritage"


class FetchError(ValueError):
    """A source that cannot be read as declared; the message names it and the fix."""


class HubUnreachable(FetchError):
    pass


def is_network_error(err: BaseException) -> bool:
    """datasets raises ConnectionError when the hub is out of reach (or HF_HUB_OFFLINE is set);
    huggingface_hub's HTTP client (httpx) raises its own TransportError family, not an OSError."""
    if isinstance(err, (ConnectionError, TimeoutError)):
        return True
    return any(cls.__name__ in ("TransportError", "EndpointConnectionError") for cls in type(err).__mro__)


def unreachable(source: FetchSource, err: BaseException) -> HubUnreachable:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return HubUnreachable(
        f"{source.name}: cannot reach the Hugging Face hub for {source.hub} ({first}); on a machine without "
        f"network, pass --from-dir DIR with a copy of the repository in DIR/{source.hub} "
        f"(`hf download {source.hub} --repo-type dataset --local-dir DIR/{source.hub}` where there is network)")


def refused(source: FetchSource, err: BaseException) -> FetchError | None:
    """The hub's answer when it refuses a file (a gated dataset not yet accepted, a private one), as one line."""
    if not type(err).__module__.startswith("huggingface_hub"):
        return None
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return FetchError(f"{source.name}: the hub refused a file of {source.hub} ({first}); a gated dataset needs its "
                      f"terms accepted on https://huggingface.co/datasets/{source.hub} and `hf auth login`")


def local_copy(from_dir: Path, source: FetchSource) -> Path:
    path = Path(from_dir) / source.hub
    if not path.is_dir():
        raise FileNotFoundError(
            f"{source.name}: --from-dir has no {path}; copy the repository there with `hf download {source.hub} "
            f"--repo-type dataset --local-dir {path}` on a machine with network (its parquet/jsonl files, README.md included)")
    return path


def check_hub(source: FetchSource) -> None:
    """Fail in a second, with the fix, when the hub cannot be reached or does not hold the dataset
    (datasets itself retries for half a minute before saying so)."""
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        huggingface_hub.HfApi().dataset_info(source.hub, revision=source.revision, timeout=20)
    except RepositoryNotFoundError:
        raise FetchError(f"{source.name}: the hub has no dataset {source.hub} (or it is private: `hf auth login`); "
                         "fix its `hub:` in the spec") from None
    except Exception as err:
        if is_network_error(err):
            raise unreachable(source, err) from None
        raise


def open_rows(source: FetchSource, from_dir: Path | None = None):
    """The source's rows as one ``datasets.IterableDataset`` (configs interleaved)."""
    import datasets

    path = str(local_copy(from_dir, source)) if from_dir is not None else source.hub
    extra = {"data_files": list(source.data_files)} if source.data_files else {}
    if from_dir is None and source.revision:
        extra["revision"] = source.revision
    try:
        parts = [datasets.load_dataset(path, config, split=source.split, streaming=True, **extra)
                 for config in source.configs]
    except Exception as err:
        if is_network_error(err):
            raise unreachable(source, err) from None
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise FetchError(f"{source.name}: datasets cannot open {path} "
                         f"(config {', '.join(map(str, source.configs))}, split {source.split}): {first}") from None
    if len(parts) == 1:
        return parts[0]
    return datasets.interleave_datasets(parts, stopping_strategy="all_exhausted_without_replacement")


@functools.lru_cache(maxsize=1)
def _s3_client():
    try:
        import boto3
    except ImportError:
        raise FetchError("Stack-Edu's file contents come from Software Heritage's S3 bucket: pip install 'infir[fetch]', "
                         "or pass --from-dir with a copy whose rows hold the text") from None
    return boto3.client("s3")


def software_heritage_text(blob_id: str, encoding: str | None) -> str | None:
    """One file of The Stack v2 by its Software Heritage blob id (gzip in the bucket; requester pays, so
    AWS credentials are needed); None when the bucket does not hold it."""
    from botocore.exceptions import ClientError, NoCredentialsError

    try:
        reply = _s3_client().get_object(Bucket=SWH_BUCKET, Key=f"content/{blob_id}", RequestPayer="requester")
    except NoCredentialsError:
        raise FetchError("Software Heritage's S3 bucket (Stack-Edu's file contents) is requester-pays: set AWS "
                         "credentials (`aws configure`), or pass --from-dir with a copy whose rows hold the text") from None
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") == "NoSuchKey":
            return None
        raise
    except Exception as err:
        if is_network_error(err):
            raise FetchError(f"cannot reach Software Heritage's S3 bucket for Stack-Edu's files ({err}); on a machine "
                             "without network, pass --from-dir with a copy whose rows hold the text") from None
        raise
    return gzip.decompress(reply["Body"].read()).decode(encoding or "utf-8", errors="replace")
