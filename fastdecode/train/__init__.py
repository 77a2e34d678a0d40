"""How the zoo models are made: tokenizer, data, training loop, export to Hugging Face folders."""
