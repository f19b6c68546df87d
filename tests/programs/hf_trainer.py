"""A plain Hugging Face ``Trainer`` job: a small BERT built from a config (nothing downloaded).

What a user writes, unchanged: a map-style dataset of token ids, ``dataloader_num_workers=2``;
``Trainer`` builds torch's DataLoader and Accelerate wraps it in its ``DataLoaderShard``. The
Trainer subclass only records what each step trained on (training_record.py); a callback ends
the run at an epoch end once ``--stop-file`` exists.

    python tests/programs/hf_trainer.py --out DIR --epochs 2
"""
from __future__ import annotations


import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

from program_data import TokenIds
from training_record import RankRecord, program_arguments, stop_requested


class RecordingTrainer(Trainer):
    """A Trainer that notes each step's samples and loss."""

    record: RankRecord

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        index = inputs.pop("idx")
        result = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        loss = result[0] if return_outputs else result
        self.record.step(self.callback_handler.train_dataloader, index.tolist(), loss.item())
        return result


class Epochs(TrainerCallback):
    """Starts an epoch in the record; ends training at an epoch end once the stop file exists."""

    def __init__(self, record: RankRecord, stop_file: str | None) -> None:
        self.record, self.stop_file = record, stop_file

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.record.epoch()

    def on_epoch_end(self, args, state, control, **kwargs):
        if stop_requested(self.stop_file):
            control.should_training_stop = True


def main() -> None:
    parser = program_arguments()
    args = parser.parse_args()

    torch.set_num_threads(1)
    dataset = TokenIds(args.samples)
    config = BertConfig(vocab_size=dataset.vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=dataset.seq_len, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    training = TrainingArguments(
        output_dir=f"{args.out}/trainer", num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        dataloader_num_workers=args.num_workers, learning_rate=1e-3, lr_scheduler_type="constant", seed=0,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
        remove_unused_columns=False,
    )
    record = RankRecord(training.process_index, training.world_size)
    trainer = RecordingTrainer(model=model, args=training, train_dataset=dataset,
                               callbacks=[Epochs(record, args.stop_file)])
    trainer.record = record
    trainer.train()
    record.write(args.out)


if __name__ == "__main__":
    main()
