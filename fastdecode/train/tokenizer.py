"""A byte-level BPE tokenizer with bos / eos / pad / mask special tokens, in Hugging Face format."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

# Pre-tokenization (before BPE merges): every digit alone (a Sudoku grid is 16 cells, not arbitrary merges
# such as "4321"), and punctuation joins the word that follows it (GPT-2 splits it off). A list then reads
# '["Kevin', ' Evans', '", "Mike', ' Walker' and '[H', ', C', ', B': each item's token follows the previous
# item's directly, so copying a list is one-token-back matching (a plain induction head) instead of matching
# across separator tokens that are the same everywhere. Small models learn the former far faster.
PRE_TOKENIZE = r"\p{N}|[^\s\p{L}\p{N}]* ?[^\s\p{L}\p{N}]*\p{L}+|[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# "words": a word takes at most the one space before it, and every other run of punctuation and spaces is a piece
# of its own. A name or a letter is then the same token wherever it stands in a list ('["', 'Kevin', ' Evans',
# '", "', 'Mike', ' Walker'; '[', 'H', ', ', 'C'). With "joined" the first item of a list is another token than the
# same name further on ('["Dan' vs '", "Dan'), so a model that moves an item (reverse, sort, shuffle, insert)
# must learn that pair for every name, and the bundled ar-small often writes one item's first name with another
# item's last name. It costs about one token more per list item.
PRE_TOKENIZERS = {"joined": PRE_TOKENIZE, "words": r"\p{N}| ?\p{L}+|[^\p{L}\p{N}]+"}

SPECIAL_TOKENS = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>", "mask_token": "<|mask|>"}


def train_tokenizer(texts: Iterable[str], vocab_size: int, pre_tokenizer: str = "joined") -> PreTrainedTokenizerFast:
    """Train byte-level BPE on `texts`; ids 0..3 are bos, eos, pad, mask; encoding prepends bos; digits stay single."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre_tokenizer]), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    bos = SPECIAL_TOKENS["bos_token"]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: str | Path) -> None:
    tokenizer.save_pretrained(str(folder))
