"""Run under `torchrun --nproc_per_node N`: load an infir checkpoint's TP shards into megatron GPTModels
(gloo, CPU) and save the full-vocabulary logits for the tokens given. Used by test_convert.py."""
import sys
import warnings

import torch
import torch.distributed as dist


def main(ckpt: str, tokens_path: str, out_path: str) -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo")
    from megatron.core import parallel_state

    from infir.model import build_gpt, transformer_config
    from infir.model import ckpt_format
    from infir.model.convert import load_into_model, size_from_meta

    tp = dist.get_world_size()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    iter_dir = ckpt_format.resolve(ckpt)
    meta = ckpt_format.read_meta(iter_dir)
    assert meta["tp"] == tp, f"checkpoint written for tp={meta['tp']}, run with {tp} processes"
    size = size_from_meta(meta)
    tokens = torch.load(tokens_path)
    model = build_gpt(size, transformer_config(size, tp=tp), seq_length=tokens.shape[1])
    load_into_model(model, ckpt_format.load_shard(iter_dir, dist.get_rank()))
    model.eval()
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        local = model(tokens, positions, None)  # [b, s, vocab / tp]: parallel_output keeps logits vocab-sharded
    pieces = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(pieces, local.contiguous())
    if dist.get_rank() == 0:
        torch.save(torch.cat(pieces, dim=-1), out_path)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
