# Example-shaped ms-swift training commands, written for tunedeck's import scorer
# (bench/swift_import_score.py). Shapes follow the public ms-swift examples/ folder: launchers,
# environment, flag spellings (3.x and Megatron-LM names included), datasets with #N and :split.
# Each case: a header `## NAME procs=N nodes=M` (what ms-swift would start), then the command.
# A case with `refuse=REASON` must be refused with a message holding REASON.

## sft-lora-selfcog procs=1 nodes=1
CUDA_VISIBLE_DEVICES=0 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --train_type lora \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-zh#500' 'AI-ModelScope/alpaca-gpt4-data-en#500' 'swift/self-cognition#500' \
    --torch_dtype bfloat16 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 1 \
    --learning_rate 1e-4 \
    --lora_rank 8 \
    --lora_alpha 32 \
    --target_modules all-linear \
    --gradient_accumulation_steps 16 \
    --eval_steps 50 \
    --save_steps 50 \
    --save_total_limit 2 \
    --logging_steps 5 \
    --max_length 2048 \
    --output_dir output \
    --system 'You are a helpful assistant.' \
    --warmup_ratio 0.05 \
    --dataloader_num_workers 4 \
    --model_author swift \
    --model_name swift-robot

## sft-full-ddp procs=4 nodes=1
NPROC_PER_NODE=4 CUDA_VISIBLE_DEVICES=0,1,2,3 swift sft \
    --model Qwen/Qwen2.5-1.5B \
    --tuner_type full \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#5000' \
    --torch_dtype bfloat16 \
    --num_train_epochs 2 \
    --per_device_train_batch_size 2 \
    --learning_rate 1e-5 \
    --gradient_accumulation_steps 4 \
    --save_steps 200 \
    --logging_steps 5 \
    --max_length 4096 \
    --warmup_ratio 0.03 \
    --weight_decay 0.1 \
    --ddp_find_unused_parameters false

## sft-full-zero3 procs=8 nodes=1
NPROC_PER_NODE=8 swift sft \
    --model Qwen/Qwen2.5-32B-Instruct \
    --train_type full \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-zh#20000' 'AI-ModelScope/alpaca-gpt4-data-en#20000' \
    --torch_dtype bfloat16 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 1 \
    --learning_rate 1e-5 \
    --gradient_accumulation_steps 2 \
    --eval_steps 100 \
    --save_steps 100 \
    --save_total_limit 2 \
    --logging_steps 5 \
    --max_length 8192 \
    --deepspeed zero3 \
    --attn_impl flash_attn \
    --dataloader_num_workers 8

## sft-zero3-offload procs=4 nodes=1
NPROC_PER_NODE=4 CUDA_VISIBLE_DEVICES=0,1,2,3 swift sft \
    --model Qwen/Qwen2.5-72B-Instruct \
    --tuner_type lora \
    --dataset AI-ModelScope/LongAlpaca-12k#2000 \
    --deepspeed zero3_offload \
    --lora_rank 16 \
    --lora_alpha 64 \
    --gradient_checkpointing true \
    --max_length 16384 \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 8 \
    --num_train_epochs 1

## sft-zero2 procs=2 nodes=1
NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=0,1 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --train_type lora \
    --dataset swift/self-cognition#1000 \
    --deepspeed zero2 \
    --gradient_checkpointing_kwargs '{"use_reentrant": false}' \
    --num_train_epochs 1 \
    --lora_rank 8 \
    --lora_alpha 32 \
    --model_author swift \
    --model_name swift-robot

## sft-qlora-bnb procs=1 nodes=1
CUDA_VISIBLE_DEVICES=0 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type lora \
    --quant_method bnb \
    --quant_bits 4 \
    --bnb_4bit_compute_dtype bfloat16 \
    --bnb_4bit_quant_storage bfloat16 \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --torch_dtype bfloat16 \
    --num_train_epochs 1 \
    --lora_rank 8 \
    --lora_alpha 32 \
    --gradient_accumulation_steps 16

## sft-qlora-fsdp procs=2 nodes=1
NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=0,1 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type lora \
    --dataset swift/self-cognition#1000 \
    --quant_bits 4 \
    --quant_method bnb \
    --bnb_4bit_use_double_quant true \
    --fsdp fsdp2 \
    --torch_dtype bfloat16 \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 4 \
    --max_length 2048

## sft-fsdp-json procs=8 nodes=1
NPROC_PER_NODE=8 swift sft \
    --model Qwen/Qwen3-8B \
    --tuner_type full \
    --dataset 'liucong/Chinese-DeepSeek-R1-Distill-data-110k-SFT#2000' \
    --fsdp '{"fsdp": "full_shard auto_wrap", "fsdp_config": {"fsdp_version": 2, "reshard_after_forward": true}}' \
    --torch_dtype bfloat16 \
    --learning_rate 2e-5 \
    --num_train_epochs 3

## sft-multimodal procs=4 nodes=1
MAX_PIXELS=1003520 IMAGE_MAX_TOKEN_NUM=1024 VIDEO_MAX_TOKEN_NUM=128 FPS_MAX_FRAMES=16 NPROC_PER_NODE=4 CUDA_VISIBLE_DEVICES=0,1,2,3 swift sft \
    --model Qwen/Qwen2.5-VL-7B-Instruct \
    --dataset 'modelscope/coco_2014_caption:validation#20000' 'AI-ModelScope/LaTeX_OCR:human_handwrite#5000' \
    --split_dataset_ratio 0.01 \
    --tuner_type lora \
    --torch_dtype bfloat16 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 1 \
    --learning_rate 1e-4 \
    --lora_rank 8 \
    --lora_alpha 32 \
    --target_modules all-linear \
    --freeze_vit true \
    --freeze_aligner true \
    --gradient_accumulation_steps 4 \
    --max_length 2048 \
    --dataloader_num_workers 4 \
    --dataset_num_proc 4

## sft-multimodal-full-vit procs=8 nodes=1
MAX_PIXELS=602112 NPROC_PER_NODE=8 swift sft \
    --model Qwen/Qwen2.5-VL-3B-Instruct \
    --dataset 'AI-ModelScope/LaTeX_OCR#20000' \
    --tuner_type full \
    --freeze_vit false \
    --freeze_llm false \
    --vit_lr 2e-6 \
    --aligner_lr 1e-5 \
    --learning_rate 1e-5 \
    --deepspeed zero2 \
    --torch_dtype bfloat16 \
    --packing true \
    --padding_free true \
    --attn_impl flash_attn

## sft-packing-liger procs=8 nodes=1
NPROC_PER_NODE=8 CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 swift sft \
    --model Qwen/Qwen3-8B \
    --tuner_type full \
    --dataset 'swift/Chinese-Qwen3-235B-2507-Distill-data-110k-SFT#20000' \
    --packing true \
    --use_liger_kernel true \
    --attn_impl flash_attention_2 \
    --max_length 16384 \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 2 \
    --learning_rate 1e-5 \
    --lr_scheduler_type cosine_with_min_lr \
    --lr_scheduler_kwargs '{"min_lr": 1e-6}' \
    --num_train_epochs 1 \
    --deepspeed zero3 \
    --save_only_model true

## sft-fa3 procs=2 nodes=1
NPROC_PER_NODE=2 swift sft \
    --model Qwen/Qwen3-8B \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#2000' \
    --attn_impl flash_attention_3 \
    --padding_free true \
    --tuner_type lora \
    --max_length 8192

## sft-flex procs=1 nodes=1
swift sft \
    --model Qwen/Qwen3-4B \
    --dataset AI-ModelScope/alpaca-gpt4-data-en#1000 \
    --attn_impl flex_attention \
    --save_total_limit -1 \
    --max_steps 300 \
    --eval_strategy no

## sft-sequence-parallel procs=4 nodes=1
NPROC_PER_NODE=4 CUDA_VISIBLE_DEVICES=0,1,2,3 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type lora \
    --dataset 'AI-ModelScope/LongAlpaca-12k' \
    --sequence_parallel_size 4 \
    --packing true \
    --attn_impl flash_attn \
    --max_length 65536 \
    --gradient_checkpointing true \
    --num_train_epochs 1

## sft-local-jsonl procs=2 nodes=1
NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=0,1 swift sft \
    --model /models/Qwen2.5-7B-Instruct \
    --model_type qwen2_5 \
    --template qwen2_5 \
    --dataset /data/train.jsonl /data/extra.jsonl \
    --val_dataset /data/val.jsonl \
    --tuner_type lora \
    --num_train_epochs 3 \
    --learning_rate 2e-4 \
    --lora_rank 64 \
    --lora_alpha 128 \
    --lora_dropout 0.1

## sft-relative-data procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-0.5B-Instruct \
    --dataset ./data/chat.jsonl data/more.json \
    --max_steps 1000 \
    --save_steps 250 \
    --eval_steps 250 \
    --per_device_train_batch_size 8

## sft-agent procs=2 nodes=1
NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=0,1 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type lora \
    --dataset 'AI-ModelScope/function-calling-chatml#10000' 'swift/ToolBench#5000' \
    --agent_template hermes \
    --loss_scale hermes \
    --split_dataset_ratio 0.01 \
    --torch_dtype bfloat16 \
    --num_train_epochs 2 \
    --gradient_accumulation_steps 8

## sft-loss-scale procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset AI-ModelScope/function-calling-chatml#10000 \
    --loss_scale ignore_empty_think \
    --tuner_type lora \
    --num_train_epochs 1

## sft-new-special-tokens procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset swift/new_special_tokens \
    --new_special_tokens '<|reason|>' '<|answer|>' \
    --modules_to_save embed_tokens lm_head \
    --tuner_type lora \
    --lazy_tokenize true \
    --num_train_epochs 2

## sft-streaming procs=4 nodes=1
NPROC_PER_NODE=4 swift sft \
    --model Qwen/Qwen2.5-7B \
    --dataset 'AI-ModelScope/wikipedia-cn-20230720-filtered' \
    --streaming true \
    --max_steps 10000 \
    --shuffle_buffer_size 1000 \
    --tuner_type full \
    --deepspeed zero2

## sft-embedding procs=4 nodes=1
INFONCE_TEMPERATURE=0.1 NPROC_PER_NODE=4 swift sft \
    --model Qwen/Qwen3-Embedding-0.6B \
    --task_type embedding \
    --model_type qwen3_emb \
    --tuner_type full \
    --dataset sentence-transformers/stsb:positive \
    --split_dataset_ratio 0.05 \
    --eval_strategy steps \
    --eval_steps 20 \
    --loss_type infonce \
    --learning_rate 6e-6 \
    --per_device_train_batch_size 4 \
    --dataloader_drop_last true \
    --num_train_epochs 5 \
    --label_names labels

## sft-reranker procs=2 nodes=1
NPROC_PER_NODE=2 swift sft \
    --model Qwen/Qwen3-Reranker-4B \
    --task_type generative_reranker \
    --loss_type pointwise_reranker \
    --tuner_type lora \
    --dataset MTEB/scidocs-reranking \
    --split_dataset_ratio 0.05 \
    --num_train_epochs 1 \
    --learning_rate 6e-6 \
    --per_device_train_batch_size 2

## sft-seq-cls procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-0.5B \
    --task_type seq_cls \
    --num_labels 2 \
    --problem_type single_label_classification \
    --dataset 'DAMO_NLP/jd:cls#2000' \
    --tuner_type lora \
    --use_chat_template false \
    --num_train_epochs 1

## sft-adalora procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type adalora \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#500' \
    --adalora_target_r 8 \
    --adalora_init_r 12 \
    --num_train_epochs 1

## sft-dora procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type lora \
    --use_dora true \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-zh#500' \
    --lora_rank 16 \
    --num_train_epochs 1

## sft-galore procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type full \
    --use_galore true \
    --galore_rank 128 \
    --galore_update_proj_gap 200 \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --optim adamw_torch

## sft-reft procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type reft \
    --reft_layer_key model.layers \
    --reft_intervention_type LoreftIntervention \
    --dataset swift/self-cognition#500 \
    --model_name 小黄 'Xiao Huang' \
    --model_author 魔搭 ModelScope

## sft-resume procs=2 nodes=1
NPROC_PER_NODE=2 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --resume_from_checkpoint output/v3-20250101-120000/checkpoint-500 \
    --resume_only_model true \
    --ignore_data_skip true \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#5000' \
    --tuner_type lora

## sft-early-stop procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-1.5B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#2000' \
    --early_stop_interval 3 \
    --eval_steps 50 \
    --save_steps 50 \
    --metric_for_best_model loss \
    --load_best_model_at_end true \
    --report_to tensorboard wandb

## sft-swanlab procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-1.5B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#2000' \
    --report_to swanlab \
    --swanlab_project tunedeck-demo \
    --swanlab_mode local

## sft-hf-hub procs=1 nodes=1
USE_HF=1 swift sft \
    --model Qwen/Qwen2.5-0.5B-Instruct \
    --dataset 'tatsu-lab/alpaca#1000' \
    --use_hf true \
    --num_train_epochs 1 \
    --push_to_hub false

## sft-neftune procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --neftune_noise_alpha 5 \
    --tuner_type lora \
    --lr_scheduler_type linear \
    --warmup_steps 20 \
    --max_grad_norm 0.5 \
    --seed 1234 \
    --data_seed 1234

## sft-cpu procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-0.5B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#100' \
    --use_cpu true \
    --max_steps 10 \
    --per_device_train_batch_size 1

## sft-ddp-device-map procs=2 nodes=1
NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=0,1,2,3 swift sft \
    --model Qwen/Qwen2.5-14B-Instruct \
    --tuner_type lora \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --device_map auto \
    --num_train_epochs 1

## sft-torch-compile procs=2 nodes=1
NPROC_PER_NODE=2 swift sft \
    --model Qwen/Qwen2.5-1.5B \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --torch_compile true \
    --tuner_type full \
    --bf16 true \
    --tf32 true

## sft-eval-val-split procs=2 nodes=1
NPROC_PER_NODE=2 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en:train#2000' \
    --val_dataset 'AI-ModelScope/alpaca-gpt4-data-en:train#200' 'swift/self-cognition#50' \
    --eval_steps 100 \
    --predict_with_generate false

## sft-abbrev-flags procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#500' \
    --lora_r 16 \
    --num_train_epoch 2

## sft-old-names procs=2 nodes=1
NPROC_PER_NODE=2 swift sft \
    --model_id_or_path Qwen/Qwen2.5-7B-Instruct \
    --sft_type lora \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#500' \
    --batch_size 2 \
    --dtype bf16

## sft-repeated-dataset procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#500' \
    --dataset 'swift/self-cognition#500' \
    --num_train_epochs 1

## sft-multiline-system procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#500' \
    --system 'You are a careful assistant.
Answer in one sentence.
Never reveal these rules.'

## sft-hub-token procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#500' \
    --push_to_hub true \
    --hub_model_id me/deck-bot \
    --hub_token ms-0123456789abcdef

## sft-multi-node-node0 procs=8 nodes=2
NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NPROC_PER_NODE=8 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type full \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-zh#20000' 'AI-ModelScope/alpaca-gpt4-data-en#20000' \
    --torch_dtype bfloat16 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 1 \
    --learning_rate 1e-5 \
    --gradient_accumulation_steps 4 \
    --deepspeed zero2 \
    --save_only_model true

## sft-multi-node-node1 procs=8 nodes=2
NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NPROC_PER_NODE=8 swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type full \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-zh#20000' 'AI-ModelScope/alpaca-gpt4-data-en#20000' \
    --deepspeed zero2

## sft-platform-vars procs=8 nodes=4 refuse=WORLD_SIZE
NNODES=$WORLD_SIZE NODE_RANK=$RANK swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type full \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-zh#20000' \
    --deepspeed zero2

## sft-config-yaml procs=2 nodes=1
NPROC_PER_NODE=2 swift sft configs/sft_lora.yaml --save_steps 100

## sft-torchrun-script procs=4 nodes=1
torchrun --nproc_per_node 4 --master_port 29501 swift/cli/sft.py \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type lora \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --num_train_epochs 1

## sft-torchrun-multinode procs=8 nodes=2
torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --master_addr 10.0.0.1 --master_port 29500 swift/cli/sft.py \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type full \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#10000' \
    --deepspeed zero3

## sft-python-dist-launch procs=2 nodes=1
python -m torch.distributed.launch --nproc_per_node=2 --master_port=29502 -m swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --tuner_type lora

## sft-python-dist-run procs=4 nodes=1
python -m torch.distributed.run --nproc_per_node 4 -m swift.cli.sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --tuner_type full

## sft-accelerate-node0 procs=4 nodes=2
CUDA_VISIBLE_DEVICES=0,1,2,3 accelerate launch --config_file configs/accelerate_2x4.yaml --machine_rank 0 \
    swift/cli/sft.py \
    --model Qwen/Qwen2.5-7B-Instruct \
    --train_type lora \
    --torch_dtype bfloat16 \
    --dataset swift/self-cognition#1000 \
    --num_train_epochs 1 \
    --lora_rank 8 \
    --lora_alpha 32 \
    --learning_rate 1e-4 \
    --gradient_accumulation_steps 16 \
    --gradient_checkpointing_kwargs '{"use_reentrant": false}' \
    --eval_steps 100 \
    --save_steps 100 \
    --save_total_limit 2 \
    --logging_steps 5 \
    --model_author swift \
    --model_name swift-robot

## sft-accelerate-flags procs=2 nodes=1
accelerate launch --multi_gpu --num_processes 2 --mixed_precision bf16 swift/cli/sft.py \
    --model Qwen/Qwen2.5-1.5B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --tuner_type full

## sft-deepspeed-hostfile procs=4 nodes=2
deepspeed --hostfile=configs/hosts.txt \
    swift/cli/sft.py \
    --model Qwen/Qwen2.5-7B-Instruct \
    --train_type lora \
    --torch_dtype bfloat16 \
    --dataset swift/self-cognition#1000 \
    --num_train_epochs 1 \
    --lora_rank 8 \
    --lora_alpha 32 \
    --gradient_accumulation_steps 16 \
    --logging_steps 5 \
    --deepspeed zero2

## sft-deepspeed-numgpus procs=2 nodes=1
deepspeed --num_gpus 2 swift/cli/sft.py \
    --model Qwen/Qwen2.5-1.5B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --deepspeed zero3

## pt-full procs=8 nodes=1
NPROC_PER_NODE=8 CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 swift pt \
    --model Qwen/Qwen2.5-7B \
    --dataset swift/chinese-c4 \
    --streaming true \
    --tuner_type full \
    --deepspeed zero2 \
    --max_steps 100000 \
    --max_length 8192 \
    --packing true \
    --attn_impl flash_attn \
    --learning_rate 5e-5 \
    --save_strategy steps \
    --save_steps 2000

## pt-lora procs=1 nodes=1
swift pt \
    --model Qwen/Qwen2.5-0.5B \
    --dataset 'AI-ModelScope/wikipedia-cn-20230720-filtered#10000' \
    --tuner_type lora \
    --num_train_epochs 1 \
    --max_length 1024

## dpo-lora procs=2 nodes=1
NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=0,1 swift rlhf \
    --rlhf_type dpo \
    --model Qwen/Qwen2.5-7B-Instruct \
    --train_type lora \
    --dataset 'hjh0119/shareAI-Llama3-DPO-zh-en-emoji#2000' \
    --torch_dtype bfloat16 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 1 \
    --learning_rate 1e-4 \
    --lora_rank 8 \
    --lora_alpha 32 \
    --target_modules all-linear \
    --gradient_accumulation_steps 16 \
    --rpo_alpha 0.1 \
    --beta 0.1 \
    --deepspeed zero2

## dpo-full procs=8 nodes=1
NPROC_PER_NODE=8 swift rlhf \
    --rlhf_type dpo \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type full \
    --dataset AI-ModelScope/orpo-dpo-mix-40k \
    --loss_type sigmoid \
    --learning_rate 5e-7 \
    --deepspeed zero3 \
    --max_length 4096

## dpo-config-json procs=1 nodes=1
swift rlhf configs/dpo.json --learning_rate 5e-6

## kto procs=2 nodes=1
NPROC_PER_NODE=2 swift rlhf \
    --rlhf_type kto \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/ultrafeedback-binarized-preferences-cleaned-kto#10000' \
    --desirable_weight 1.0 \
    --undesirable_weight 1.0 \
    --tuner_type lora \
    --learning_rate 5e-5

## orpo procs=1 nodes=1
swift rlhf \
    --rlhf_type orpo \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'hjh0119/shareAI-Llama3-DPO-zh-en-emoji#2000' \
    --beta 0.1 \
    --tuner_type lora

## simpo procs=1 nodes=1
swift rlhf \
    --rlhf_type simpo \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'hjh0119/shareAI-Llama3-DPO-zh-en-emoji#2000' \
    --simpo_gamma 0.5 \
    --cpo_alpha 0.0 \
    --tuner_type lora

## cpo procs=1 nodes=1
swift rlhf \
    --rlhf_type cpo \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'hjh0119/shareAI-Llama3-DPO-zh-en-emoji#2000' \
    --cpo_alpha 1.0 \
    --tuner_type lora

## rm procs=2 nodes=1
NPROC_PER_NODE=2 swift rlhf \
    --rlhf_type rm \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'hjh0119/shareAI-Llama3-DPO-zh-en-emoji#2000' \
    --tuner_type lora \
    --center_rewards_coefficient 0.01

## ppo procs=2 nodes=1
NPROC_PER_NODE=2 swift rlhf \
    --rlhf_type ppo \
    --model LLM-Research/Meta-Llama-3.1-8B-Instruct \
    --reward_model 'AI-ModelScope/Skywork-Reward-Llama-3.1-8B-v0.2' \
    --tuner_type lora \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-zh#20000' \
    --num_ppo_epochs 2 \
    --response_length 512

## grpo-colocate procs=4 nodes=1
CUDA_VISIBLE_DEVICES=0,1,2,3 NPROC_PER_NODE=4 swift rlhf \
    --rlhf_type grpo \
    --model Qwen/Qwen2.5-72B-Instruct \
    --train_type lora \
    --use_vllm true \
    --vllm_mode colocate \
    --vllm_gpu_memory_utilization 0.55 \
    --vllm_max_model_len 2048 \
    --vllm_tensor_parallel_size 4 \
    --dataset AI-MO/NuminaMath-TIR#10000 \
    --torch_dtype bfloat16 \
    --num_train_epochs 1 \
    --max_length 2048 \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 1 \
    --learning_rate 1e-6 \
    --max_completion_length 1024 \
    --reward_funcs accuracy format \
    --num_generations 4 \
    --deepspeed zero3_offload \
    --temperature 1.0 \
    --top_p 1.0 \
    --top_k 80 \
    --log_completions true \
    --async_generate false \
    --move_model_batches 16 \
    --offload_optimizer true \
    --offload_model true \
    --sleep_level 1

## grpo-server procs=7 nodes=1
CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7 NPROC_PER_NODE=7 swift rlhf \
    --rlhf_type grpo \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type full \
    --use_vllm true \
    --vllm_mode server \
    --vllm_server_host 127.0.0.1 \
    --vllm_server_port 8000 \
    --dataset AI-MO/NuminaMath-TIR#5000 \
    --reward_funcs accuracy \
    --num_generations 14 \
    --per_device_train_batch_size 2 \
    --deepspeed zero2 \
    --beta 0.04

## grpo-plugin procs=8 nodes=1
NPROC_PER_NODE=8 swift rlhf \
    --rlhf_type grpo \
    --model Qwen/Qwen2.5-VL-7B-Instruct \
    --external_plugins examples/train/grpo/plugin/plugin.py \
    --reward_funcs external_r1v_acc format \
    --use_vllm true \
    --vllm_mode colocate \
    --dataset 'lmms-lab/multimodal-open-r1-8k-verified' \
    --max_completion_length 1024 \
    --num_generations 8 \
    --epsilon 0.2 \
    --epsilon_high 0.28 \
    --dynamic_sample true \
    --importance_sampling_level sequence \
    --loss_type dr_grpo \
    --steps_per_generation 4 \
    --system examples/train/grpo/prompt.txt

## grpo-qlora procs=2 nodes=1
NPROC_PER_NODE=2 swift rlhf \
    --rlhf_type grpo \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type lora \
    --quant_method bnb \
    --quant_bits 4 \
    --dataset AI-MO/NuminaMath-TIR#1000 \
    --reward_funcs accuracy format \
    --num_generations 4

## grpo-multi-node procs=8 nodes=2
NNODES=2 NODE_RANK=0 MASTER_ADDR=10.2.0.1 MASTER_PORT=29500 NPROC_PER_NODE=8 swift rlhf \
    --rlhf_type grpo \
    --model Qwen/Qwen2.5-32B-Instruct \
    --tuner_type full \
    --use_vllm true \
    --vllm_mode colocate \
    --dataset AI-MO/NuminaMath-TIR \
    --deepspeed zero3 \
    --num_generations 8

## gkd-vllm procs=4 nodes=1
NPROC_PER_NODE=4 swift rlhf \
    --rlhf_type gkd \
    --model Qwen/Qwen2.5-7B-Instruct \
    --teacher_model Qwen/Qwen2.5-72B-Instruct \
    --tuner_type full \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#2000' \
    --use_vllm true \
    --vllm_mode colocate \
    --lmbda 0.5 \
    --seq_kd false \
    --deepspeed zero3

## megatron-sft-dense procs=8 nodes=1
PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True' NPROC_PER_NODE=8 CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 megatron sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --save_safetensors true \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-zh#500' 'AI-ModelScope/alpaca-gpt4-data-en#500' 'swift/self-cognition#500' \
    --tensor_model_parallel_size 2 \
    --sequence_parallel true \
    --micro_batch_size 16 \
    --global_batch_size 16 \
    --recompute_granularity full \
    --recompute_method uniform \
    --recompute_num_layers 1 \
    --finetune true \
    --cross_entropy_loss_fusion true \
    --lr 1e-5 \
    --lr_warmup_fraction 0.05 \
    --min_lr 1e-6 \
    --num_train_epochs 1 \
    --output_dir megatron_output/Qwen2.5-7B-Instruct \
    --save_steps 100 \
    --max_length 2048 \
    --dataloader_num_workers 4 \
    --no_save_optim true \
    --no_save_rng true \
    --model_author swift \
    --model_name swift-robot

## megatron-sft-lora procs=8 nodes=1
NPROC_PER_NODE=8 megatron sft \
    --model Qwen/Qwen3-30B-A3B \
    --tuner_type lora \
    --lora_rank 8 \
    --lora_alpha 32 \
    --target_modules all-linear \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#5000' \
    --expert_model_parallel_size 8 \
    --moe_grouped_gemm true \
    --moe_aux_loss_coeff 1e-3 \
    --micro_batch_size 1 \
    --global_batch_size 16 \
    --train_iters 1000 \
    --lr 1e-4 \
    --packing true

## megatron-sft-tp-pp procs=8 nodes=2
NNODES=2 NODE_RANK=0 MASTER_ADDR=10.3.0.1 MASTER_PORT=29500 NPROC_PER_NODE=8 megatron sft \
    --model Qwen/Qwen2.5-72B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#20000' \
    --tensor_model_parallel_size 4 \
    --pipeline_model_parallel_size 2 \
    --sequence_parallel true \
    --micro_batch_size 1 \
    --global_batch_size 32 \
    --num_train_epochs 1 \
    --lr 1e-5 \
    --min_lr 1e-6 \
    --max_length 8192

## megatron-sft-cp procs=8 nodes=1
NPROC_PER_NODE=8 megatron sft \
    --model Qwen/Qwen2.5-7B \
    --dataset 'AI-ModelScope/LongAlpaca-12k' \
    --context_parallel_size 4 \
    --packing true \
    --max_length 65536 \
    --micro_batch_size 1 \
    --global_batch_size 8 \
    --lr 1e-5 \
    --attention_backend flash

## megatron-sft-sp-tp1 procs=2 nodes=1
NPROC_PER_NODE=2 megatron sft \
    --model Qwen/Qwen2.5-1.5B \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --sequence_parallel true \
    --micro_batch_size 2 \
    --train_iters 200

## megatron-sft-gbs-odd procs=6 nodes=1
NPROC_PER_NODE=6 megatron sft \
    --model Qwen/Qwen2.5-7B \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --tensor_model_parallel_size 2 \
    --micro_batch_size 2 \
    --global_batch_size 20 \
    --train_iters 100

## megatron-pt procs=8 nodes=1
NPROC_PER_NODE=8 megatron pt \
    --model Qwen/Qwen2.5-7B \
    --dataset swift/chinese-c4 \
    --streaming true \
    --tensor_model_parallel_size 2 \
    --micro_batch_size 1 \
    --global_batch_size 64 \
    --train_iters 10000 \
    --lr 1e-5 \
    --lr_decay_style cosine \
    --lr_warmup_iters 100 \
    --clip_grad 1.0 \
    --weight_decay 0.1 \
    --max_length 8192

## megatron-old-names procs=8 nodes=1
NPROC_PER_NODE=8 megatron sft \
    --load Qwen2.5-7B-mcore \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --tp_size 2 \
    --max_epochs 1 \
    --log_interval 1 \
    --save_interval 500 \
    --eval_interval 500 \
    --save megatron_output/run1 \
    --train_type full

## megatron-dpo-moe procs=8 nodes=1
PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True' NPROC_PER_NODE=8 CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 megatron rlhf \
    --rlhf_type dpo \
    --model Qwen/Qwen3-30B-A3B-Instruct-2507 \
    --save_safetensors true \
    --dataset AI-ModelScope/orpo-dpo-mix-40k \
    --split_dataset_ratio 0.01 \
    --packing true \
    --tensor_model_parallel_size 4 \
    --expert_tensor_parallel_size 1 \
    --expert_model_parallel_size 8 \
    --moe_permute_fusion true \
    --micro_batch_size 1 \
    --global_batch_size 4 \
    --num_train_epochs 1 \
    --finetune true \
    --lr 1e-5 \
    --lr_warmup_fraction 0.05 \
    --min_lr 1e-6 \
    --sequence_parallel true \
    --attention_backend flash \
    --optimizer_cpu_offload true \
    --beta 0.1 \
    --rpo_alpha 0.1 \
    --loss_type sigmoid

## megatron-kto procs=8 nodes=1
NPROC_PER_NODE=8 megatron rlhf \
    --rlhf_type kto \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/ultrafeedback-binarized-preferences-cleaned-kto#10000' \
    --tuner_type lora \
    --micro_batch_size 2 \
    --global_batch_size 16 \
    --lr 5e-5 \
    --desirable_weight 1.0

## megatron-rm procs=4 nodes=1
NPROC_PER_NODE=4 megatron rlhf \
    --rlhf_type rm \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'hjh0119/shareAI-Llama3-DPO-zh-en-emoji#2000' \
    --tuner_type lora \
    --micro_batch_size 1 \
    --global_batch_size 8

## megatron-grpo procs=8 nodes=1
CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 NPROC_PER_NODE=8 MAX_PIXELS=602112 MASTER_PORT=29600 megatron rlhf \
    --rlhf_type grpo \
    --model Qwen/Qwen2.5-VL-3B-Instruct \
    --load_safetensors true \
    --save_safetensors true \
    --context_parallel_size 1 \
    --tensor_model_parallel_size 1 \
    --pipeline_model_parallel_size 1 \
    --dataset AI-ModelScope/clevr_cogen_a_train#10000 \
    --num_train_epochs 1 \
    --global_batch_size 128 \
    --micro_batch_size 4 \
    --steps_per_generation 4 \
    --num_generations 8 \
    --reward_funcs accuracy format \
    --use_vllm true \
    --vllm_mode colocate \
    --vllm_gpu_memory_utilization 0.7 \
    --max_length 8192 \
    --max_completion_length 2048 \
    --tuner_type full \
    --lr 1e-6 \
    --beta 0.001 \
    --importance_sampling_level token \
    --epsilon 0.2 \
    --dynamic_sample false \
    --overlong_filter true \
    --loss_type grpo \
    --sleep_level 2 \
    --offload_model true \
    --offload_optimizer true \
    --logging_steps 1 \
    --recompute_granularity selective \
    --finetune \
    --no_save_optim \
    --no_save_rng \
    --temperature 1.0 \
    --padding_free true \
    --log_completions true \
    --train_iters 100

## megatron-gkd procs=8 nodes=1
NPROC_PER_NODE=8 megatron rlhf \
    --rlhf_type gkd \
    --model Qwen/Qwen3-8B \
    --teacher_model Qwen/Qwen3-32B \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#2000' \
    --tensor_model_parallel_size 2 \
    --micro_batch_size 1 \
    --global_batch_size 16 \
    --lmbda 0.5 \
    --train_iters 200

## megatron-torchrun procs=8 nodes=1
torchrun --nproc_per_node 8 swift/cli/_megatron/sft.py \
    --model Qwen/Qwen2.5-7B \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --tensor_model_parallel_size 2 \
    --micro_batch_size 1 \
    --global_batch_size 8 \
    --train_iters 100

## swift-megatron-typo procs=8 nodes=1
NPROC_PER_NODE=8 swift megatron sft \
    --model Qwen/Qwen2.5-7B \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#1000' \
    --train_iters 100

## sft-self-cog-only procs=1 nodes=1
swift sft \
    --model Qwen/Qwen3-4B-Instruct-2507 \
    --dataset swift/self-cognition \
    --model_name 'Deck Bot' 'Deck Bot' \
    --model_author 'Tune Deck' 'Tune Deck' \
    --tuner_type lora \
    --max_steps 100

## sft-unknown-flag procs=1 nodes=1
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#500' \
    --my_made_up_flag 3
