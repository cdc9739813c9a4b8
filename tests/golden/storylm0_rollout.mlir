// MLIR emitted by tilegen from Kina tensor IR (func, linalg, tensor, arith, math on tensors).
// Check: mlir-opt-19 --verify-each FILE.mlir
#map0 = affine_map<(d0, d1, d2) -> (d0, d1)>
#map1 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map2 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map3 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>

func.func @split_heads(%x: tensor<1x36x4xf32>) -> (tensor<1x2x36x2xf32>) {
  %t0 = tensor.expand_shape %x [[0], [1], [2, 3]] output_shape [1, 36, 2, 2] : tensor<1x36x4xf32> into tensor<1x36x2x2xf32>
  %t1_init = tensor.empty() : tensor<1x2x36x2xf32>
  %t1 = linalg.transpose ins(%t0 : tensor<1x36x2x2xf32>) outs(%t1_init : tensor<1x2x36x2xf32>) permutation = [0, 2, 1, 3]
  return %t1 : tensor<1x2x36x2xf32>
}

func.func @storylm0_rollout(%token_ids: tensor<1x36xi64>, %token_embedding: tensor<8x4xf32>, %causal_mask: tensor<1x1x36x36xf32>, %scale: tensor<1x1x1x1xf32>, %wq: tensor<4x4xf32>, %wk: tensor<4x4xf32>, %wv: tensor<4x4xf32>, %wo: tensor<4x4xf32>, %lm_head: tensor<4x8xf32>) -> (tensor<1x36x8xf32>) {
  %x_init = tensor.empty() : tensor<1x36x4xf32>
  %x = linalg.generic {indexing_maps = [#map0, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%token_ids : tensor<1x36xi64>)
      outs(%x_init : tensor<1x36x4xf32>) {
  ^bb0(%in: i64, %out: f32):
    %row = arith.index_cast %in : i64 to index
    %i2 = linalg.index 2 : index
    %elem = tensor.extract %token_embedding[%row, %i2] : tensor<8x4xf32>
    linalg.yield %elem : f32
  } -> tensor<1x36x4xf32>
  %t0_init = tensor.empty() : tensor<1x4x4xf32>
  %t0 = linalg.broadcast ins(%wq : tensor<4x4xf32>) outs(%t0_init : tensor<1x4x4xf32>) dimensions = [0]
  %cst = arith.constant 0.0 : f32
  %t1_acc_init = tensor.empty() : tensor<1x36x4xf32>
  %t1_acc = linalg.fill ins(%cst : f32) outs(%t1_acc_init : tensor<1x36x4xf32>) -> tensor<1x36x4xf32>
  %t1 = linalg.batch_matmul ins(%x, %t0 : tensor<1x36x4xf32>, tensor<1x4x4xf32>) outs(%t1_acc : tensor<1x36x4xf32>) -> tensor<1x36x4xf32>
  %q = func.call @split_heads(%t1) : (tensor<1x36x4xf32>) -> (tensor<1x2x36x2xf32>)
  %t2_init = tensor.empty() : tensor<1x4x4xf32>
  %t2 = linalg.broadcast ins(%wk : tensor<4x4xf32>) outs(%t2_init : tensor<1x4x4xf32>) dimensions = [0]
  %t3_acc_init = tensor.empty() : tensor<1x36x4xf32>
  %t3_acc = linalg.fill ins(%cst : f32) outs(%t3_acc_init : tensor<1x36x4xf32>) -> tensor<1x36x4xf32>
  %t3 = linalg.batch_matmul ins(%x, %t2 : tensor<1x36x4xf32>, tensor<1x4x4xf32>) outs(%t3_acc : tensor<1x36x4xf32>) -> tensor<1x36x4xf32>
  %k = func.call @split_heads(%t3) : (tensor<1x36x4xf32>) -> (tensor<1x2x36x2xf32>)
  %t4_init = tensor.empty() : tensor<1x4x4xf32>
  %t4 = linalg.broadcast ins(%wv : tensor<4x4xf32>) outs(%t4_init : tensor<1x4x4xf32>) dimensions = [0]
  %t5_acc_init = tensor.empty() : tensor<1x36x4xf32>
  %t5_acc = linalg.fill ins(%cst : f32) outs(%t5_acc_init : tensor<1x36x4xf32>) -> tensor<1x36x4xf32>
  %t5 = linalg.batch_matmul ins(%x, %t4 : tensor<1x36x4xf32>, tensor<1x4x4xf32>) outs(%t5_acc : tensor<1x36x4xf32>) -> tensor<1x36x4xf32>
  %v = func.call @split_heads(%t5) : (tensor<1x36x4xf32>) -> (tensor<1x2x36x2xf32>)
  %t6_init = tensor.empty() : tensor<1x2x2x36xf32>
  %t6 = linalg.transpose ins(%k : tensor<1x2x36x2xf32>) outs(%t6_init : tensor<1x2x2x36xf32>) permutation = [0, 1, 3, 2]
  %scores_lhs = tensor.collapse_shape %q [[0, 1], [2], [3]] : tensor<1x2x36x2xf32> into tensor<2x36x2xf32>
  %scores_rhs = tensor.collapse_shape %t6 [[0, 1], [2], [3]] : tensor<1x2x2x36xf32> into tensor<2x2x36xf32>
  %scores_batched_acc_init = tensor.empty() : tensor<2x36x36xf32>
  %scores_batched_acc = linalg.fill ins(%cst : f32) outs(%scores_batched_acc_init : tensor<2x36x36xf32>) -> tensor<2x36x36xf32>
  %scores_batched = linalg.batch_matmul ins(%scores_lhs, %scores_rhs : tensor<2x36x2xf32>, tensor<2x2x36xf32>) outs(%scores_batched_acc : tensor<2x36x36xf32>) -> tensor<2x36x36xf32>
  %scores = tensor.expand_shape %scores_batched [[0, 1], [2], [3]] output_shape [1, 2, 36, 36] : tensor<2x36x36xf32> into tensor<1x2x36x36xf32>
  %t7_squeezed = tensor.collapse_shape %scale [[0, 1, 2, 3]] : tensor<1x1x1x1xf32> into tensor<1xf32>
  %t7_init = tensor.empty() : tensor<1x2x36x36xf32>
  %t7 = linalg.broadcast ins(%t7_squeezed : tensor<1xf32>) outs(%t7_init : tensor<1x2x36x36xf32>) dimensions = [1, 2, 3]
  %t8_init = tensor.empty() : tensor<1x2x36x36xf32>
  %t8 = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%scores, %t7 : tensor<1x2x36x36xf32>, tensor<1x2x36x36xf32>)
      outs(%t8_init : tensor<1x2x36x36xf32>) {
  ^bb0(%in_1: f32, %in_2: f32, %out_1: f32):
    %v_1 = arith.mulf %in_1, %in_2 : f32
    linalg.yield %v_1 : f32
  } -> tensor<1x2x36x36xf32>
  %t9_squeezed = tensor.collapse_shape %causal_mask [[0, 1], [2], [3]] : tensor<1x1x36x36xf32> into tensor<1x36x36xf32>
  %t9_init = tensor.empty() : tensor<1x2x36x36xf32>
  %t9 = linalg.broadcast ins(%t9_squeezed : tensor<1x36x36xf32>) outs(%t9_init : tensor<1x2x36x36xf32>) dimensions = [1]
  %s_init = tensor.empty() : tensor<1x2x36x36xf32>
  %s = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%t8, %t9 : tensor<1x2x36x36xf32>, tensor<1x2x36x36xf32>)
      outs(%s_init : tensor<1x2x36x36xf32>) {
  ^bb0(%in_3: f32, %in_4: f32, %out_2: f32):
    %v_2 = arith.addf %in_3, %in_4 : f32
    linalg.yield %v_2 : f32
  } -> tensor<1x2x36x36xf32>
  %cst_1 = arith.constant 0xFF800000 : f32
  %p_max_acc_init = tensor.empty() : tensor<1x2x36xf32>
  %p_max_acc = linalg.fill ins(%cst_1 : f32) outs(%p_max_acc_init : tensor<1x2x36xf32>) -> tensor<1x2x36xf32>
  %p_max = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%s : tensor<1x2x36x36xf32>)
      outs(%p_max_acc : tensor<1x2x36xf32>) {
  ^bb0(%in_5: f32, %out_3: f32):
    %v_3 = arith.maximumf %in_5, %out_3 : f32
    linalg.yield %v_3 : f32
  } -> tensor<1x2x36xf32>
  %p_exp_init = tensor.empty() : tensor<1x2x36x36xf32>
  %p_exp = linalg.generic {indexing_maps = [#map2, #map3, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%s, %p_max : tensor<1x2x36x36xf32>, tensor<1x2x36xf32>)
      outs(%p_exp_init : tensor<1x2x36x36xf32>) {
  ^bb0(%in_6: f32, %in_7: f32, %out_4: f32):
    %v_4 = arith.subf %in_6, %in_7 : f32
    %v_5 = math.exp %v_4 : f32
    linalg.yield %v_5 : f32
  } -> tensor<1x2x36x36xf32>
  %p_sum_acc_init = tensor.empty() : tensor<1x2x36xf32>
  %p_sum_acc = linalg.fill ins(%cst : f32) outs(%p_sum_acc_init : tensor<1x2x36xf32>) -> tensor<1x2x36xf32>
  %p_sum = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%p_exp : tensor<1x2x36x36xf32>)
      outs(%p_sum_acc : tensor<1x2x36xf32>) {
  ^bb0(%in_8: f32, %out_5: f32):
    %v_6 = arith.addf %in_8, %out_5 : f32
    linalg.yield %v_6 : f32
  } -> tensor<1x2x36xf32>
  %p_init = tensor.empty() : tensor<1x2x36x36xf32>
  %p = linalg.generic {indexing_maps = [#map2, #map3, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%p_exp, %p_sum : tensor<1x2x36x36xf32>, tensor<1x2x36xf32>)
      outs(%p_init : tensor<1x2x36x36xf32>) {
  ^bb0(%in_9: f32, %in_10: f32, %out_6: f32):
    %v_7 = arith.divf %in_9, %in_10 : f32
    linalg.yield %v_7 : f32
  } -> tensor<1x2x36x36xf32>
  %t10_lhs = tensor.collapse_shape %p [[0, 1], [2], [3]] : tensor<1x2x36x36xf32> into tensor<2x36x36xf32>
  %t10_rhs = tensor.collapse_shape %v [[0, 1], [2], [3]] : tensor<1x2x36x2xf32> into tensor<2x36x2xf32>
  %t10_batched_acc_init = tensor.empty() : tensor<2x36x2xf32>
  %t10_batched_acc = linalg.fill ins(%cst : f32) outs(%t10_batched_acc_init : tensor<2x36x2xf32>) -> tensor<2x36x2xf32>
  %t10_batched = linalg.batch_matmul ins(%t10_lhs, %t10_rhs : tensor<2x36x36xf32>, tensor<2x36x2xf32>) outs(%t10_batched_acc : tensor<2x36x2xf32>) -> tensor<2x36x2xf32>
  %t10 = tensor.expand_shape %t10_batched [[0, 1], [2], [3]] output_shape [1, 2, 36, 2] : tensor<2x36x2xf32> into tensor<1x2x36x2xf32>
  %t11_init = tensor.empty() : tensor<1x36x2x2xf32>
  %t11 = linalg.transpose ins(%t10 : tensor<1x2x36x2xf32>) outs(%t11_init : tensor<1x36x2x2xf32>) permutation = [0, 2, 1, 3]
  %o = tensor.collapse_shape %t11 [[0], [1], [2, 3]] : tensor<1x36x2x2xf32> into tensor<1x36x4xf32>
  %t12_init = tensor.empty() : tensor<1x4x4xf32>
  %t12 = linalg.broadcast ins(%wo : tensor<4x4xf32>) outs(%t12_init : tensor<1x4x4xf32>) dimensions = [0]
  %t13_acc_init = tensor.empty() : tensor<1x36x4xf32>
  %t13_acc = linalg.fill ins(%cst : f32) outs(%t13_acc_init : tensor<1x36x4xf32>) -> tensor<1x36x4xf32>
  %t13 = linalg.batch_matmul ins(%o, %t12 : tensor<1x36x4xf32>, tensor<1x4x4xf32>) outs(%t13_acc : tensor<1x36x4xf32>) -> tensor<1x36x4xf32>
  %h_init = tensor.empty() : tensor<1x36x4xf32>
  %h = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x, %t13 : tensor<1x36x4xf32>, tensor<1x36x4xf32>)
      outs(%h_init : tensor<1x36x4xf32>) {
  ^bb0(%in_11: f32, %in_12: f32, %out_7: f32):
    %v_8 = arith.addf %in_11, %in_12 : f32
    linalg.yield %v_8 : f32
  } -> tensor<1x36x4xf32>
  %t14_init = tensor.empty() : tensor<1x4x8xf32>
  %t14 = linalg.broadcast ins(%lm_head : tensor<4x8xf32>) outs(%t14_init : tensor<1x4x8xf32>) dimensions = [0]
  %t15_acc_init = tensor.empty() : tensor<1x36x8xf32>
  %t15_acc = linalg.fill ins(%cst : f32) outs(%t15_acc_init : tensor<1x36x8xf32>) -> tensor<1x36x8xf32>
  %t15 = linalg.batch_matmul ins(%h, %t14 : tensor<1x36x4xf32>, tensor<1x4x8xf32>) outs(%t15_acc : tensor<1x36x8xf32>) -> tensor<1x36x8xf32>
  return %t15 : tensor<1x36x8xf32>
}

func.func @greedy_row(%row: tensor<1x1x8xf32>) -> (tensor<1x1xi64>) {
  %cst = arith.constant 0xFF800000 : f32
  %t0_value_acc_init = tensor.empty() : tensor<1x1xf32>
  %t0_value_acc = linalg.fill ins(%cst : f32) outs(%t0_value_acc_init : tensor<1x1xf32>) -> tensor<1x1xf32>
  %c = arith.constant 0 : i64
  %t0_acc_init = tensor.empty() : tensor<1x1xi64>
  %t0_acc = linalg.fill ins(%c : i64) outs(%t0_acc_init : tensor<1x1xi64>) -> tensor<1x1xi64>
  %t0_value, %t0 = linalg.generic {indexing_maps = [#map1, #map0, #map0], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%row : tensor<1x1x8xf32>)
      outs(%t0_value_acc, %t0_acc : tensor<1x1xf32>, tensor<1x1xi64>) {
  ^bb0(%in: f32, %out: f32, %out_1: i64):
    %greater = arith.cmpf ogt, %in, %out : f32
    %is_nan = arith.cmpf uno, %in, %in : f32
    %best_num = arith.cmpf ord, %out, %out : f32
    %first_nan = arith.andi %is_nan, %best_num : i1
    %take = arith.ori %greater, %first_nan : i1
    %i2 = linalg.index 2 : index
    %i2_i64 = arith.index_cast %i2 : index to i64
    %best = arith.select %take, %in, %out : f32
    %best_index = arith.select %take, %i2_i64, %out_1 : i64
    linalg.yield %best, %best_index : f32, i64
  } -> (tensor<1x1xf32>, tensor<1x1xi64>)
  return %t0 : tensor<1x1xi64>
}

func.func @sample_row(%row: tensor<1x1x8xf32>, %u: tensor<1x1x8xf32>, %temperature: tensor<1x1xf32>) -> (tensor<1x1xi64>) {
  %t0_init = tensor.empty() : tensor<1x1x8xf32>
  %t0 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%u : tensor<1x1x8xf32>)
      outs(%t0_init : tensor<1x1x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %v = math.log %in : f32
    linalg.yield %v : f32
  } -> tensor<1x1x8xf32>
  %t1_init = tensor.empty() : tensor<1x1x8xf32>
  %t1 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t0 : tensor<1x1x8xf32>)
      outs(%t1_init : tensor<1x1x8xf32>) {
  ^bb0(%in_1: f32, %out_1: f32):
    %v_1 = arith.negf %in_1 : f32
    linalg.yield %v_1 : f32
  } -> tensor<1x1x8xf32>
  %t2_init = tensor.empty() : tensor<1x1x8xf32>
  %t2 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t1 : tensor<1x1x8xf32>)
      outs(%t2_init : tensor<1x1x8xf32>) {
  ^bb0(%in_2: f32, %out_2: f32):
    %v_2 = math.log %in_2 : f32
    linalg.yield %v_2 : f32
  } -> tensor<1x1x8xf32>
  %gumbel_init = tensor.empty() : tensor<1x1x8xf32>
  %gumbel = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t2 : tensor<1x1x8xf32>)
      outs(%gumbel_init : tensor<1x1x8xf32>) {
  ^bb0(%in_3: f32, %out_3: f32):
    %v_3 = arith.negf %in_3 : f32
    linalg.yield %v_3 : f32
  } -> tensor<1x1x8xf32>
  %t3_squeezed = tensor.collapse_shape %temperature [[0, 1]] : tensor<1x1xf32> into tensor<1xf32>
  %t3_init = tensor.empty() : tensor<1x1x8xf32>
  %t3 = linalg.broadcast ins(%t3_squeezed : tensor<1xf32>) outs(%t3_init : tensor<1x1x8xf32>) dimensions = [0, 2]
  %scaled_init = tensor.empty() : tensor<1x1x8xf32>
  %scaled = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%row, %t3 : tensor<1x1x8xf32>, tensor<1x1x8xf32>)
      outs(%scaled_init : tensor<1x1x8xf32>) {
  ^bb0(%in_4: f32, %in_5: f32, %out_4: f32):
    %v_4 = arith.divf %in_4, %in_5 : f32
    linalg.yield %v_4 : f32
  } -> tensor<1x1x8xf32>
  %t4_init = tensor.empty() : tensor<1x1x8xf32>
  %t4 = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%scaled, %gumbel : tensor<1x1x8xf32>, tensor<1x1x8xf32>)
      outs(%t4_init : tensor<1x1x8xf32>) {
  ^bb0(%in_6: f32, %in_7: f32, %out_5: f32):
    %v_5 = arith.addf %in_6, %in_7 : f32
    linalg.yield %v_5 : f32
  } -> tensor<1x1x8xf32>
  %cst = arith.constant 0xFF800000 : f32
  %t5_value_acc_init = tensor.empty() : tensor<1x1xf32>
  %t5_value_acc = linalg.fill ins(%cst : f32) outs(%t5_value_acc_init : tensor<1x1xf32>) -> tensor<1x1xf32>
  %c = arith.constant 0 : i64
  %t5_acc_init = tensor.empty() : tensor<1x1xi64>
  %t5_acc = linalg.fill ins(%c : i64) outs(%t5_acc_init : tensor<1x1xi64>) -> tensor<1x1xi64>
  %t5_value, %t5 = linalg.generic {indexing_maps = [#map1, #map0, #map0], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%t4 : tensor<1x1x8xf32>)
      outs(%t5_value_acc, %t5_acc : tensor<1x1xf32>, tensor<1x1xi64>) {
  ^bb0(%in_8: f32, %out_6: f32, %out_7: i64):
    %greater = arith.cmpf ogt, %in_8, %out_6 : f32
    %is_nan = arith.cmpf uno, %in_8, %in_8 : f32
    %best_num = arith.cmpf ord, %out_6, %out_6 : f32
    %first_nan = arith.andi %is_nan, %best_num : i1
    %take = arith.ori %greater, %first_nan : i1
    %i2 = linalg.index 2 : index
    %i2_i64 = arith.index_cast %i2 : index to i64
    %best = arith.select %take, %in_8, %out_6 : f32
    %best_index = arith.select %take, %i2_i64, %out_7 : i64
    linalg.yield %best, %best_index : f32, i64
  } -> (tensor<1x1xf32>, tensor<1x1xi64>)
  return %t5 : tensor<1x1xi64>
}

func.func @main(%ids: tensor<1x36xi64>, %embed: tensor<8x4xf32>, %mask: tensor<1x1x36x36xf32>, %scale: tensor<1x1x1x1xf32>, %wq: tensor<4x4xf32>, %wk: tensor<4x4xf32>, %wv: tensor<4x4xf32>, %wo: tensor<4x4xf32>, %lm_head: tensor<4x8xf32>, %row: tensor<1x1x8xf32>, %u: tensor<1x1x8xf32>, %temperature: tensor<1x1xf32>) -> (tensor<1x36x8xf32>, tensor<1x1xi64>, tensor<1x1xi64>) {
  %logits = func.call @storylm0_rollout(%ids, %embed, %mask, %scale, %wq, %wk, %wv, %wo, %lm_head) : (tensor<1x36xi64>, tensor<8x4xf32>, tensor<1x1x36x36xf32>, tensor<1x1x1x1xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>) -> (tensor<1x36x8xf32>)
  %greedy = func.call @greedy_row(%row) : (tensor<1x1x8xf32>) -> (tensor<1x1xi64>)
  %sampled = func.call @sample_row(%row, %u, %temperature) : (tensor<1x1x8xf32>, tensor<1x1x8xf32>, tensor<1x1xf32>) -> (tensor<1x1xi64>)
  return %logits, %greedy, %sampled : tensor<1x36x8xf32>, tensor<1x1xi64>, tensor<1x1xi64>
}
