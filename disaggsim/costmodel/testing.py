"""Constant-cost test double: step times with simple closed forms, for exact engine tests.

prefill = ``prefill_base_s + prefill_per_token_s × new_tokens``;
decode step = ``decode_base_s + decode_per_seq_s × batch + decode_per_context_token_s × C``;
mixed = decode step (if any decode) + prefill part (if any prefill) − one shared base.

A mixed step's decode part is the decode step a decode worker takes
(:func:`~disaggsim.costmodel.interface.decode_step_time_s`), so a subclass that adds decode
lines (an item line, kernel lines, lines keyed by the batch's longest sequence) has them in
chunked steps too; ``decode_longest_history_tokens`` is the protocol's
(:meth:`disaggsim.costmodel.interface.WorkerCost.mixed_time_s`). A subclass keeps this
mixed step rather than overriding it with a decode-only one.
"""

from __future__ import annotations

from dataclasses import dataclass

from disaggsim.costmodel.interface import decode_step_time_s


@dataclass(frozen=True, slots=True)
class ConstantCost:
    prefill_base_s: float = 0.010
    prefill_per_token_s: float = 0.0
    decode_base_s: float = 0.010
    decode_per_seq_s: float = 0.0
    decode_per_context_token_s: float = 0.0
    kv_bytes_per_token: int = 1000
    kv_capacity_tokens: int = 1_000_000
    weights_bytes: int = 10**9
    num_gpus: int = 1

    def prefill_time_s(self, num_seqs, new_tokens, attn_pairs, cached_tokens=0):
        return self.prefill_base_s + self.prefill_per_token_s * new_tokens

    def decode_coeffs(self, batch):
        return self.decode_base_s + self.decode_per_seq_s * batch, self.decode_per_context_token_s

    def mixed_time_s(
        self,
        decode_batch,
        decode_context_tokens,
        prefill_seqs,
        prefill_tokens,
        prefill_attn_pairs,
        prefill_cached_tokens=0,
        decode_longest_history_tokens=None,
    ):
        t = 0.0
        if decode_batch:  # the decode step as a decode worker takes it (every line it has)
            t += decode_step_time_s(
                self, decode_batch, decode_context_tokens, decode_longest_history_tokens
            )
        if prefill_tokens:
            t += self.prefill_per_token_s * prefill_tokens
            if not decode_batch:
                t += self.prefill_base_s
        return t
