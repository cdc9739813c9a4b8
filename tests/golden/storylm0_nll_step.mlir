// MLIR emitted by tilegen from Kina tensor IR (func, linalg, tensor, arith, math on tensors).
// Check: mlir-opt-19 --verify-each FILE.mlir
#map0 = affine_map<(d0, d1, d2) -> (d0, d1)>
#map1 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map2 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map3 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
#map4 = affine_map<(d0, d1) -> (d0, d1)>
#map5 = affine_map<(d0, d1) -> (d0)>
#map6 = affine_map<(d0) -> (d0)>
#map7 = affine_map<(d0) -> ()>
#map8 = affine_map<() -> ()>
#map9 = affine_map<(d0, d1, d2, d3) -> (d2, d3, d1)>
#map10 = affine_map<(d0, d1, d2, d3) -> (d2, d3)>
#map11 = affine_map<(d0, d1, d2, d3) -> (d0, d1)>

func.func @split_heads(%x: tensor<1x4x4xf32>) -> (tensor<1x2x4x2xf32>) {
  %t0 = tensor.expand_shape %x [[0], [1], [2, 3]] output_shape [1, 4, 2, 2] : tensor<1x4x4xf32> into tensor<1x4x2x2xf32>
  %t1_init = tensor.empty() : tensor<1x2x4x2xf32>
  %t1 = linalg.transpose ins(%t0 : tensor<1x4x2x2xf32>) outs(%t1_init : tensor<1x2x4x2xf32>) permutation = [0, 2, 1, 3]
  return %t1 : tensor<1x2x4x2xf32>
}

func.func @storylm0_forward(%token_ids: tensor<1x4xi64>, %token_embedding: tensor<8x4xf32>, %causal_mask: tensor<1x1x4x4xf32>, %scale: tensor<1x1x1x1xf32>, %wq: tensor<4x4xf32>, %wk: tensor<4x4xf32>, %wv: tensor<4x4xf32>, %wo: tensor<4x4xf32>, %lm_head: tensor<4x8xf32>) -> (tensor<1x4x8xf32>) {
  %x_init = tensor.empty() : tensor<1x4x4xf32>
  %x = linalg.generic {indexing_maps = [#map0, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%token_ids : tensor<1x4xi64>)
      outs(%x_init : tensor<1x4x4xf32>) {
  ^bb0(%in: i64, %out: f32):
    %row = arith.index_cast %in : i64 to index
    %i2 = linalg.index 2 : index
    %elem = tensor.extract %token_embedding[%row, %i2] : tensor<8x4xf32>
    linalg.yield %elem : f32
  } -> tensor<1x4x4xf32>
  %t0_init = tensor.empty() : tensor<1x4x4xf32>
  %t0 = linalg.broadcast ins(%wq : tensor<4x4xf32>) outs(%t0_init : tensor<1x4x4xf32>) dimensions = [0]
  %cst = arith.constant 0.0 : f32
  %t1_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %t1_acc = linalg.fill ins(%cst : f32) outs(%t1_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %t1 = linalg.batch_matmul ins(%x, %t0 : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%t1_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %q = func.call @split_heads(%t1) : (tensor<1x4x4xf32>) -> (tensor<1x2x4x2xf32>)
  %t2_init = tensor.empty() : tensor<1x4x4xf32>
  %t2 = linalg.broadcast ins(%wk : tensor<4x4xf32>) outs(%t2_init : tensor<1x4x4xf32>) dimensions = [0]
  %t3_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %t3_acc = linalg.fill ins(%cst : f32) outs(%t3_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %t3 = linalg.batch_matmul ins(%x, %t2 : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%t3_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %k = func.call @split_heads(%t3) : (tensor<1x4x4xf32>) -> (tensor<1x2x4x2xf32>)
  %t4_init = tensor.empty() : tensor<1x4x4xf32>
  %t4 = linalg.broadcast ins(%wv : tensor<4x4xf32>) outs(%t4_init : tensor<1x4x4xf32>) dimensions = [0]
  %t5_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %t5_acc = linalg.fill ins(%cst : f32) outs(%t5_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %t5 = linalg.batch_matmul ins(%x, %t4 : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%t5_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %v = func.call @split_heads(%t5) : (tensor<1x4x4xf32>) -> (tensor<1x2x4x2xf32>)
  %t6_init = tensor.empty() : tensor<1x2x2x4xf32>
  %t6 = linalg.transpose ins(%k : tensor<1x2x4x2xf32>) outs(%t6_init : tensor<1x2x2x4xf32>) permutation = [0, 1, 3, 2]
  %scores_lhs = tensor.collapse_shape %q [[0, 1], [2], [3]] : tensor<1x2x4x2xf32> into tensor<2x4x2xf32>
  %scores_rhs = tensor.collapse_shape %t6 [[0, 1], [2], [3]] : tensor<1x2x2x4xf32> into tensor<2x2x4xf32>
  %scores_batched_acc_init = tensor.empty() : tensor<2x4x4xf32>
  %scores_batched_acc = linalg.fill ins(%cst : f32) outs(%scores_batched_acc_init : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %scores_batched = linalg.batch_matmul ins(%scores_lhs, %scores_rhs : tensor<2x4x2xf32>, tensor<2x2x4xf32>) outs(%scores_batched_acc : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %scores = tensor.expand_shape %scores_batched [[0, 1], [2], [3]] output_shape [1, 2, 4, 4] : tensor<2x4x4xf32> into tensor<1x2x4x4xf32>
  %t7_squeezed = tensor.collapse_shape %scale [[0, 1, 2, 3]] : tensor<1x1x1x1xf32> into tensor<1xf32>
  %t7_init = tensor.empty() : tensor<1x2x4x4xf32>
  %t7 = linalg.broadcast ins(%t7_squeezed : tensor<1xf32>) outs(%t7_init : tensor<1x2x4x4xf32>) dimensions = [1, 2, 3]
  %t8_init = tensor.empty() : tensor<1x2x4x4xf32>
  %t8 = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%scores, %t7 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>)
      outs(%t8_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_1: f32, %in_2: f32, %out_1: f32):
    %v_1 = arith.mulf %in_1, %in_2 : f32
    linalg.yield %v_1 : f32
  } -> tensor<1x2x4x4xf32>
  %t9_squeezed = tensor.collapse_shape %causal_mask [[0, 1], [2], [3]] : tensor<1x1x4x4xf32> into tensor<1x4x4xf32>
  %t9_init = tensor.empty() : tensor<1x2x4x4xf32>
  %t9 = linalg.broadcast ins(%t9_squeezed : tensor<1x4x4xf32>) outs(%t9_init : tensor<1x2x4x4xf32>) dimensions = [1]
  %s_init = tensor.empty() : tensor<1x2x4x4xf32>
  %s = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%t8, %t9 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>)
      outs(%s_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_3: f32, %in_4: f32, %out_2: f32):
    %v_2 = arith.addf %in_3, %in_4 : f32
    linalg.yield %v_2 : f32
  } -> tensor<1x2x4x4xf32>
  %cst_1 = arith.constant 0xFF800000 : f32
  %p_max_acc_init = tensor.empty() : tensor<1x2x4xf32>
  %p_max_acc = linalg.fill ins(%cst_1 : f32) outs(%p_max_acc_init : tensor<1x2x4xf32>) -> tensor<1x2x4xf32>
  %p_max = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%s : tensor<1x2x4x4xf32>)
      outs(%p_max_acc : tensor<1x2x4xf32>) {
  ^bb0(%in_5: f32, %out_3: f32):
    %v_3 = arith.maximumf %in_5, %out_3 : f32
    linalg.yield %v_3 : f32
  } -> tensor<1x2x4xf32>
  %p_exp_init = tensor.empty() : tensor<1x2x4x4xf32>
  %p_exp = linalg.generic {indexing_maps = [#map2, #map3, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%s, %p_max : tensor<1x2x4x4xf32>, tensor<1x2x4xf32>)
      outs(%p_exp_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_6: f32, %in_7: f32, %out_4: f32):
    %v_4 = arith.subf %in_6, %in_7 : f32
    %v_5 = math.exp %v_4 : f32
    linalg.yield %v_5 : f32
  } -> tensor<1x2x4x4xf32>
  %p_sum_acc_init = tensor.empty() : tensor<1x2x4xf32>
  %p_sum_acc = linalg.fill ins(%cst : f32) outs(%p_sum_acc_init : tensor<1x2x4xf32>) -> tensor<1x2x4xf32>
  %p_sum = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%p_exp : tensor<1x2x4x4xf32>)
      outs(%p_sum_acc : tensor<1x2x4xf32>) {
  ^bb0(%in_8: f32, %out_5: f32):
    %v_6 = arith.addf %in_8, %out_5 : f32
    linalg.yield %v_6 : f32
  } -> tensor<1x2x4xf32>
  %p_init = tensor.empty() : tensor<1x2x4x4xf32>
  %p = linalg.generic {indexing_maps = [#map2, #map3, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%p_exp, %p_sum : tensor<1x2x4x4xf32>, tensor<1x2x4xf32>)
      outs(%p_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_9: f32, %in_10: f32, %out_6: f32):
    %v_7 = arith.divf %in_9, %in_10 : f32
    linalg.yield %v_7 : f32
  } -> tensor<1x2x4x4xf32>
  %t10_lhs = tensor.collapse_shape %p [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32>
  %t10_rhs = tensor.collapse_shape %v [[0, 1], [2], [3]] : tensor<1x2x4x2xf32> into tensor<2x4x2xf32>
  %t10_batched_acc_init = tensor.empty() : tensor<2x4x2xf32>
  %t10_batched_acc = linalg.fill ins(%cst : f32) outs(%t10_batched_acc_init : tensor<2x4x2xf32>) -> tensor<2x4x2xf32>
  %t10_batched = linalg.batch_matmul ins(%t10_lhs, %t10_rhs : tensor<2x4x4xf32>, tensor<2x4x2xf32>) outs(%t10_batched_acc : tensor<2x4x2xf32>) -> tensor<2x4x2xf32>
  %t10 = tensor.expand_shape %t10_batched [[0, 1], [2], [3]] output_shape [1, 2, 4, 2] : tensor<2x4x2xf32> into tensor<1x2x4x2xf32>
  %t11_init = tensor.empty() : tensor<1x4x2x2xf32>
  %t11 = linalg.transpose ins(%t10 : tensor<1x2x4x2xf32>) outs(%t11_init : tensor<1x4x2x2xf32>) permutation = [0, 2, 1, 3]
  %o = tensor.collapse_shape %t11 [[0], [1], [2, 3]] : tensor<1x4x2x2xf32> into tensor<1x4x4xf32>
  %t12_init = tensor.empty() : tensor<1x4x4xf32>
  %t12 = linalg.broadcast ins(%wo : tensor<4x4xf32>) outs(%t12_init : tensor<1x4x4xf32>) dimensions = [0]
  %t13_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %t13_acc = linalg.fill ins(%cst : f32) outs(%t13_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %t13 = linalg.batch_matmul ins(%o, %t12 : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%t13_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %h_init = tensor.empty() : tensor<1x4x4xf32>
  %h = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x, %t13 : tensor<1x4x4xf32>, tensor<1x4x4xf32>)
      outs(%h_init : tensor<1x4x4xf32>) {
  ^bb0(%in_11: f32, %in_12: f32, %out_7: f32):
    %v_8 = arith.addf %in_11, %in_12 : f32
    linalg.yield %v_8 : f32
  } -> tensor<1x4x4xf32>
  %t14_init = tensor.empty() : tensor<1x4x8xf32>
  %t14 = linalg.broadcast ins(%lm_head : tensor<4x8xf32>) outs(%t14_init : tensor<1x4x8xf32>) dimensions = [0]
  %t15_acc_init = tensor.empty() : tensor<1x4x8xf32>
  %t15_acc = linalg.fill ins(%cst : f32) outs(%t15_acc_init : tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  %t15 = linalg.batch_matmul ins(%h, %t14 : tensor<1x4x4xf32>, tensor<1x4x8xf32>) outs(%t15_acc : tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  return %t15 : tensor<1x4x8xf32>
}

func.func @storylm0_nll(%token_ids: tensor<1x4xi64>, %targets: tensor<1x4xi64>, %embed: tensor<8x4xf32>, %wq: tensor<4x4xf32>, %wk: tensor<4x4xf32>, %wv: tensor<4x4xf32>, %wo: tensor<4x4xf32>, %lm_head: tensor<4x8xf32>, %causal_mask: tensor<1x1x4x4xf32>, %scale: tensor<1x1x1x1xf32>) -> (tensor<f32>) {
  %logits = func.call @storylm0_forward(%token_ids, %embed, %causal_mask, %scale, %wq, %wk, %wv, %wo, %lm_head) : (tensor<1x4xi64>, tensor<8x4xf32>, tensor<1x1x4x4xf32>, tensor<1x1x1x1xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>) -> (tensor<1x4x8xf32>)
  %cst = arith.constant 0xFF800000 : f32
  %t0_max_acc_init = tensor.empty() : tensor<1x4xf32>
  %t0_max_acc = linalg.fill ins(%cst : f32) outs(%t0_max_acc_init : tensor<1x4xf32>) -> tensor<1x4xf32>
  %t0_max = linalg.generic {indexing_maps = [#map1, #map0], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%logits : tensor<1x4x8xf32>)
      outs(%t0_max_acc : tensor<1x4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %v = arith.maximumf %in, %out : f32
    linalg.yield %v : f32
  } -> tensor<1x4xf32>
  %t0_shifted_init = tensor.empty() : tensor<1x4x8xf32>
  %t0_shifted = linalg.generic {indexing_maps = [#map1, #map0, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%logits, %t0_max : tensor<1x4x8xf32>, tensor<1x4xf32>)
      outs(%t0_shifted_init : tensor<1x4x8xf32>) {
  ^bb0(%in_1: f32, %in_2: f32, %out_1: f32):
    %v_1 = arith.subf %in_1, %in_2 : f32
    linalg.yield %v_1 : f32
  } -> tensor<1x4x8xf32>
  %cst_1 = arith.constant 0.0 : f32
  %t0_sum_acc_init = tensor.empty() : tensor<1x4xf32>
  %t0_sum_acc = linalg.fill ins(%cst_1 : f32) outs(%t0_sum_acc_init : tensor<1x4xf32>) -> tensor<1x4xf32>
  %t0_sum = linalg.generic {indexing_maps = [#map1, #map0], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%t0_shifted : tensor<1x4x8xf32>)
      outs(%t0_sum_acc : tensor<1x4xf32>) {
  ^bb0(%in_3: f32, %out_2: f32):
    %v_2 = math.exp %in_3 : f32
    %v_3 = arith.addf %v_2, %out_2 : f32
    linalg.yield %v_3 : f32
  } -> tensor<1x4xf32>
  %t0_init = tensor.empty() : tensor<1x4x8xf32>
  %t0 = linalg.generic {indexing_maps = [#map1, #map0, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t0_shifted, %t0_sum : tensor<1x4x8xf32>, tensor<1x4xf32>)
      outs(%t0_init : tensor<1x4x8xf32>) {
  ^bb0(%in_4: f32, %in_5: f32, %out_3: f32):
    %v_4 = math.log %in_5 : f32
    %v_5 = arith.subf %in_4, %v_4 : f32
    linalg.yield %v_5 : f32
  } -> tensor<1x4x8xf32>
  %cst_2 = arith.constant 1.0 : f32
  %t1_init = tensor.empty() : tensor<1x4x8xf32>
  %t1 = linalg.generic {indexing_maps = [#map0, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%targets : tensor<1x4xi64>)
      outs(%t1_init : tensor<1x4x8xf32>) {
  ^bb0(%in_6: i64, %out_4: f32):
    %i2 = linalg.index 2 : index
    %i2_i64 = arith.index_cast %i2 : index to i64
    %hit = arith.cmpi eq, %in_6, %i2_i64 : i64
    %elem = arith.select %hit, %cst_2, %cst_1 : f32
    linalg.yield %elem : f32
  } -> tensor<1x4x8xf32>
  %picked_init = tensor.empty() : tensor<1x4x8xf32>
  %picked = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t0, %t1 : tensor<1x4x8xf32>, tensor<1x4x8xf32>)
      outs(%picked_init : tensor<1x4x8xf32>) {
  ^bb0(%in_7: f32, %in_8: f32, %out_5: f32):
    %v_6 = arith.mulf %in_7, %in_8 : f32
    linalg.yield %v_6 : f32
  } -> tensor<1x4x8xf32>
  %t2_acc_init = tensor.empty() : tensor<1x4xf32>
  %t2_acc = linalg.fill ins(%cst_1 : f32) outs(%t2_acc_init : tensor<1x4xf32>) -> tensor<1x4xf32>
  %t2 = linalg.generic {indexing_maps = [#map1, #map0], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%picked : tensor<1x4x8xf32>)
      outs(%t2_acc : tensor<1x4xf32>) {
  ^bb0(%in_9: f32, %out_6: f32):
    %v_7 = arith.addf %in_9, %out_6 : f32
    linalg.yield %v_7 : f32
  } -> tensor<1x4xf32>
  %t3_acc_init = tensor.empty() : tensor<1xf32>
  %t3_acc = linalg.fill ins(%cst_1 : f32) outs(%t3_acc_init : tensor<1xf32>) -> tensor<1xf32>
  %t3 = linalg.generic {indexing_maps = [#map4, #map5], iterator_types = ["parallel", "reduction"]}
      ins(%t2 : tensor<1x4xf32>)
      outs(%t3_acc : tensor<1xf32>) {
  ^bb0(%in_10: f32, %out_7: f32):
    %v_8 = arith.addf %in_10, %out_7 : f32
    linalg.yield %v_8 : f32
  } -> tensor<1xf32>
  %t4_acc_init = tensor.empty() : tensor<f32>
  %t4_acc = linalg.fill ins(%cst_1 : f32) outs(%t4_acc_init : tensor<f32>) -> tensor<f32>
  %t4 = linalg.generic {indexing_maps = [#map6, #map7], iterator_types = ["reduction"]}
      ins(%t3 : tensor<1xf32>)
      outs(%t4_acc : tensor<f32>) {
  ^bb0(%in_11: f32, %out_8: f32):
    %v_9 = arith.addf %in_11, %out_8 : f32
    linalg.yield %v_9 : f32
  } -> tensor<f32>
  %t5_init = tensor.empty() : tensor<f32>
  %t5 = linalg.generic {indexing_maps = [#map8, #map8], iterator_types = []}
      ins(%t4 : tensor<f32>)
      outs(%t5_init : tensor<f32>) {
  ^bb0(%in_12: f32, %out_9: f32):
    %v_10 = arith.negf %in_12 : f32
    linalg.yield %v_10 : f32
  } -> tensor<f32>
  return %t5 : tensor<f32>
}

func.func @sgd_dd(%w: tensor<4x4xf32>, %g: tensor<4x4xf32>, %lr: tensor<1x1xf32>) -> (tensor<4x4xf32>) {
  %t0_squeezed = tensor.collapse_shape %lr [] : tensor<1x1xf32> into tensor<f32>
  %t0_init = tensor.empty() : tensor<4x4xf32>
  %t0 = linalg.broadcast ins(%t0_squeezed : tensor<f32>) outs(%t0_init : tensor<4x4xf32>) dimensions = [0, 1]
  %t1_init = tensor.empty() : tensor<4x4xf32>
  %t1 = linalg.generic {indexing_maps = [#map4, #map4, #map4], iterator_types = ["parallel", "parallel"]}
      ins(%t0, %g : tensor<4x4xf32>, tensor<4x4xf32>)
      outs(%t1_init : tensor<4x4xf32>) {
  ^bb0(%in: f32, %in_1: f32, %out: f32):
    %v = arith.mulf %in, %in_1 : f32
    linalg.yield %v : f32
  } -> tensor<4x4xf32>
  %t2_init = tensor.empty() : tensor<4x4xf32>
  %t2 = linalg.generic {indexing_maps = [#map4, #map4, #map4], iterator_types = ["parallel", "parallel"]}
      ins(%w, %t1 : tensor<4x4xf32>, tensor<4x4xf32>)
      outs(%t2_init : tensor<4x4xf32>) {
  ^bb0(%in_2: f32, %in_3: f32, %out_1: f32):
    %v_1 = arith.subf %in_2, %in_3 : f32
    linalg.yield %v_1 : f32
  } -> tensor<4x4xf32>
  return %t2 : tensor<4x4xf32>
}

func.func @storylm0_nll__grad_2_3_4_5_6_7(%token_ids: tensor<1x4xi64>, %targets: tensor<1x4xi64>, %embed: tensor<8x4xf32>, %wq: tensor<4x4xf32>, %wk: tensor<4x4xf32>, %wv: tensor<4x4xf32>, %wo: tensor<4x4xf32>, %lm_head: tensor<4x8xf32>, %causal_mask: tensor<1x1x4x4xf32>, %scale: tensor<1x1x1x1xf32>) -> (tensor<f32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>) {
  %storylm0_forward.x_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.x = linalg.generic {indexing_maps = [#map0, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%token_ids : tensor<1x4xi64>)
      outs(%storylm0_forward.x_init : tensor<1x4x4xf32>) {
  ^bb0(%in: i64, %out: f32):
    %row = arith.index_cast %in : i64 to index
    %i2 = linalg.index 2 : index
    %elem = tensor.extract %embed[%row, %i2] : tensor<8x4xf32>
    linalg.yield %elem : f32
  } -> tensor<1x4x4xf32>
  %storylm0_forward.t0_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t0 = linalg.broadcast ins(%wq : tensor<4x4xf32>) outs(%storylm0_forward.t0_init : tensor<1x4x4xf32>) dimensions = [0]
  %cst = arith.constant 0.0 : f32
  %storylm0_forward.t1_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t1_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t1_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t1 = linalg.batch_matmul ins(%storylm0_forward.x, %storylm0_forward.t0 : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t1_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %split_heads.t0 = tensor.expand_shape %storylm0_forward.t1 [[0], [1], [2, 3]] output_shape [1, 4, 2, 2] : tensor<1x4x4xf32> into tensor<1x4x2x2xf32>
  %split_heads.t1_init = tensor.empty() : tensor<1x2x4x2xf32>
  %split_heads.t1 = linalg.transpose ins(%split_heads.t0 : tensor<1x4x2x2xf32>) outs(%split_heads.t1_init : tensor<1x2x4x2xf32>) permutation = [0, 2, 1, 3]
  %storylm0_forward.t2_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t2 = linalg.broadcast ins(%wk : tensor<4x4xf32>) outs(%storylm0_forward.t2_init : tensor<1x4x4xf32>) dimensions = [0]
  %storylm0_forward.t3_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t3_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t3_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t3 = linalg.batch_matmul ins(%storylm0_forward.x, %storylm0_forward.t2 : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t3_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %split_heads.t0.1 = tensor.expand_shape %storylm0_forward.t3 [[0], [1], [2, 3]] output_shape [1, 4, 2, 2] : tensor<1x4x4xf32> into tensor<1x4x2x2xf32>
  %split_heads.t1.2_init = tensor.empty() : tensor<1x2x4x2xf32>
  %split_heads.t1.2 = linalg.transpose ins(%split_heads.t0.1 : tensor<1x4x2x2xf32>) outs(%split_heads.t1.2_init : tensor<1x2x4x2xf32>) permutation = [0, 2, 1, 3]
  %storylm0_forward.t4_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t4 = linalg.broadcast ins(%wv : tensor<4x4xf32>) outs(%storylm0_forward.t4_init : tensor<1x4x4xf32>) dimensions = [0]
  %storylm0_forward.t5_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t5_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t5_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t5 = linalg.batch_matmul ins(%storylm0_forward.x, %storylm0_forward.t4 : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t5_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %split_heads.t0.3 = tensor.expand_shape %storylm0_forward.t5 [[0], [1], [2, 3]] output_shape [1, 4, 2, 2] : tensor<1x4x4xf32> into tensor<1x4x2x2xf32>
  %split_heads.t1.4_init = tensor.empty() : tensor<1x2x4x2xf32>
  %split_heads.t1.4 = linalg.transpose ins(%split_heads.t0.3 : tensor<1x4x2x2xf32>) outs(%split_heads.t1.4_init : tensor<1x2x4x2xf32>) permutation = [0, 2, 1, 3]
  %storylm0_forward.t6_init = tensor.empty() : tensor<1x2x2x4xf32>
  %storylm0_forward.t6 = linalg.transpose ins(%split_heads.t0.1 : tensor<1x4x2x2xf32>) outs(%storylm0_forward.t6_init : tensor<1x2x2x4xf32>) permutation = [0, 2, 3, 1]
  %storylm0_forward.scores_lhs = tensor.collapse_shape %split_heads.t1 [[0, 1], [2], [3]] : tensor<1x2x4x2xf32> into tensor<2x4x2xf32>
  %storylm0_forward.scores_rhs = tensor.collapse_shape %storylm0_forward.t6 [[0, 1], [2], [3]] : tensor<1x2x2x4xf32> into tensor<2x2x4xf32>
  %storylm0_forward.scores_batched_acc_init = tensor.empty() : tensor<2x4x4xf32>
  %storylm0_forward.scores_batched_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.scores_batched_acc_init : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %storylm0_forward.scores_batched = linalg.batch_matmul ins(%storylm0_forward.scores_lhs, %storylm0_forward.scores_rhs : tensor<2x4x2xf32>, tensor<2x2x4xf32>) outs(%storylm0_forward.scores_batched_acc : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %storylm0_forward.scores = tensor.expand_shape %storylm0_forward.scores_batched [[0, 1], [2], [3]] output_shape [1, 2, 4, 4] : tensor<2x4x4xf32> into tensor<1x2x4x4xf32>
  %storylm0_forward.t7_squeezed = tensor.collapse_shape %scale [[0, 1, 2, 3]] : tensor<1x1x1x1xf32> into tensor<1xf32>
  %storylm0_forward.t7_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.t7 = linalg.broadcast ins(%storylm0_forward.t7_squeezed : tensor<1xf32>) outs(%storylm0_forward.t7_init : tensor<1x2x4x4xf32>) dimensions = [1, 2, 3]
  %storylm0_forward.t8_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.t8 = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.scores, %storylm0_forward.t7 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>)
      outs(%storylm0_forward.t8_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_1: f32, %in_2: f32, %out_1: f32):
    %v = arith.mulf %in_1, %in_2 : f32
    linalg.yield %v : f32
  } -> tensor<1x2x4x4xf32>
  %storylm0_forward.t9_squeezed = tensor.collapse_shape %causal_mask [[0, 1], [2], [3]] : tensor<1x1x4x4xf32> into tensor<1x4x4xf32>
  %storylm0_forward.t9_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.t9 = linalg.broadcast ins(%storylm0_forward.t9_squeezed : tensor<1x4x4xf32>) outs(%storylm0_forward.t9_init : tensor<1x2x4x4xf32>) dimensions = [1]
  %storylm0_forward.s_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.s = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.t8, %storylm0_forward.t9 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>)
      outs(%storylm0_forward.s_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_3: f32, %in_4: f32, %out_2: f32):
    %v_1 = arith.addf %in_3, %in_4 : f32
    linalg.yield %v_1 : f32
  } -> tensor<1x2x4x4xf32>
  %cst_1 = arith.constant 0xFF800000 : f32
  %storylm0_forward.p_max_acc_init = tensor.empty() : tensor<1x2x4xf32>
  %storylm0_forward.p_max_acc = linalg.fill ins(%cst_1 : f32) outs(%storylm0_forward.p_max_acc_init : tensor<1x2x4xf32>) -> tensor<1x2x4xf32>
  %storylm0_forward.p_max = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%storylm0_forward.s : tensor<1x2x4x4xf32>)
      outs(%storylm0_forward.p_max_acc : tensor<1x2x4xf32>) {
  ^bb0(%in_5: f32, %out_3: f32):
    %v_2 = arith.maximumf %in_5, %out_3 : f32
    linalg.yield %v_2 : f32
  } -> tensor<1x2x4xf32>
  %storylm0_forward.p_exp_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.p_exp = linalg.generic {indexing_maps = [#map2, #map3, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.s, %storylm0_forward.p_max : tensor<1x2x4x4xf32>, tensor<1x2x4xf32>)
      outs(%storylm0_forward.p_exp_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_6: f32, %in_7: f32, %out_4: f32):
    %v_3 = arith.subf %in_6, %in_7 : f32
    %v_4 = math.exp %v_3 : f32
    linalg.yield %v_4 : f32
  } -> tensor<1x2x4x4xf32>
  %storylm0_forward.p_sum_acc_init = tensor.empty() : tensor<1x2x4xf32>
  %storylm0_forward.p_sum_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.p_sum_acc_init : tensor<1x2x4xf32>) -> tensor<1x2x4xf32>
  %storylm0_forward.p_sum = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%storylm0_forward.p_exp : tensor<1x2x4x4xf32>)
      outs(%storylm0_forward.p_sum_acc : tensor<1x2x4xf32>) {
  ^bb0(%in_8: f32, %out_5: f32):
    %v_5 = arith.addf %in_8, %out_5 : f32
    linalg.yield %v_5 : f32
  } -> tensor<1x2x4xf32>
  %storylm0_forward.p_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.p = linalg.generic {indexing_maps = [#map2, #map3, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.p_exp, %storylm0_forward.p_sum : tensor<1x2x4x4xf32>, tensor<1x2x4xf32>)
      outs(%storylm0_forward.p_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_9: f32, %in_10: f32, %out_6: f32):
    %v_6 = arith.divf %in_9, %in_10 : f32
    linalg.yield %v_6 : f32
  } -> tensor<1x2x4x4xf32>
  %storylm0_forward.t10_lhs = tensor.collapse_shape %storylm0_forward.p [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32>
  %storylm0_forward.t10_rhs = tensor.collapse_shape %split_heads.t1.4 [[0, 1], [2], [3]] : tensor<1x2x4x2xf32> into tensor<2x4x2xf32>
  %storylm0_forward.t10_batched_acc_init = tensor.empty() : tensor<2x4x2xf32>
  %storylm0_forward.t10_batched_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t10_batched_acc_init : tensor<2x4x2xf32>) -> tensor<2x4x2xf32>
  %storylm0_forward.t10_batched = linalg.batch_matmul ins(%storylm0_forward.t10_lhs, %storylm0_forward.t10_rhs : tensor<2x4x4xf32>, tensor<2x4x2xf32>) outs(%storylm0_forward.t10_batched_acc : tensor<2x4x2xf32>) -> tensor<2x4x2xf32>
  %storylm0_forward.t10 = tensor.expand_shape %storylm0_forward.t10_batched [[0, 1], [2], [3]] output_shape [1, 2, 4, 2] : tensor<2x4x2xf32> into tensor<1x2x4x2xf32>
  %storylm0_forward.t11_init = tensor.empty() : tensor<1x4x2x2xf32>
  %storylm0_forward.t11 = linalg.transpose ins(%storylm0_forward.t10 : tensor<1x2x4x2xf32>) outs(%storylm0_forward.t11_init : tensor<1x4x2x2xf32>) permutation = [0, 2, 1, 3]
  %storylm0_forward.o = tensor.collapse_shape %storylm0_forward.t11 [[0], [1], [2, 3]] : tensor<1x4x2x2xf32> into tensor<1x4x4xf32>
  %storylm0_forward.t12_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t12 = linalg.broadcast ins(%wo : tensor<4x4xf32>) outs(%storylm0_forward.t12_init : tensor<1x4x4xf32>) dimensions = [0]
  %storylm0_forward.t13_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t13_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t13_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t13 = linalg.batch_matmul ins(%storylm0_forward.o, %storylm0_forward.t12 : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t13_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.h_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.h = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.x, %storylm0_forward.t13 : tensor<1x4x4xf32>, tensor<1x4x4xf32>)
      outs(%storylm0_forward.h_init : tensor<1x4x4xf32>) {
  ^bb0(%in_11: f32, %in_12: f32, %out_7: f32):
    %v_7 = arith.addf %in_11, %in_12 : f32
    linalg.yield %v_7 : f32
  } -> tensor<1x4x4xf32>
  %storylm0_forward.t14_init = tensor.empty() : tensor<1x4x8xf32>
  %storylm0_forward.t14 = linalg.broadcast ins(%lm_head : tensor<4x8xf32>) outs(%storylm0_forward.t14_init : tensor<1x4x8xf32>) dimensions = [0]
  %storylm0_forward.t15_acc_init = tensor.empty() : tensor<1x4x8xf32>
  %storylm0_forward.t15_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t15_acc_init : tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  %storylm0_forward.t15 = linalg.batch_matmul ins(%storylm0_forward.h, %storylm0_forward.t14 : tensor<1x4x4xf32>, tensor<1x4x8xf32>) outs(%storylm0_forward.t15_acc : tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  %t0_max_acc_init = tensor.empty() : tensor<1x4xf32>
  %t0_max_acc = linalg.fill ins(%cst_1 : f32) outs(%t0_max_acc_init : tensor<1x4xf32>) -> tensor<1x4xf32>
  %t0_max = linalg.generic {indexing_maps = [#map1, #map0], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%storylm0_forward.t15 : tensor<1x4x8xf32>)
      outs(%t0_max_acc : tensor<1x4xf32>) {
  ^bb0(%in_13: f32, %out_8: f32):
    %v_8 = arith.maximumf %in_13, %out_8 : f32
    linalg.yield %v_8 : f32
  } -> tensor<1x4xf32>
  %t0_shifted_init = tensor.empty() : tensor<1x4x8xf32>
  %t0_shifted = linalg.generic {indexing_maps = [#map1, #map0, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.t15, %t0_max : tensor<1x4x8xf32>, tensor<1x4xf32>)
      outs(%t0_shifted_init : tensor<1x4x8xf32>) {
  ^bb0(%in_14: f32, %in_15: f32, %out_9: f32):
    %v_9 = arith.subf %in_14, %in_15 : f32
    linalg.yield %v_9 : f32
  } -> tensor<1x4x8xf32>
  %t0_sum_acc_init = tensor.empty() : tensor<1x4xf32>
  %t0_sum_acc = linalg.fill ins(%cst : f32) outs(%t0_sum_acc_init : tensor<1x4xf32>) -> tensor<1x4xf32>
  %t0_sum = linalg.generic {indexing_maps = [#map1, #map0], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%t0_shifted : tensor<1x4x8xf32>)
      outs(%t0_sum_acc : tensor<1x4xf32>) {
  ^bb0(%in_16: f32, %out_10: f32):
    %v_10 = math.exp %in_16 : f32
    %v_11 = arith.addf %v_10, %out_10 : f32
    linalg.yield %v_11 : f32
  } -> tensor<1x4xf32>
  %t0_init = tensor.empty() : tensor<1x4x8xf32>
  %t0 = linalg.generic {indexing_maps = [#map1, #map0, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t0_shifted, %t0_sum : tensor<1x4x8xf32>, tensor<1x4xf32>)
      outs(%t0_init : tensor<1x4x8xf32>) {
  ^bb0(%in_17: f32, %in_18: f32, %out_11: f32):
    %v_12 = math.log %in_18 : f32
    %v_13 = arith.subf %in_17, %v_12 : f32
    linalg.yield %v_13 : f32
  } -> tensor<1x4x8xf32>
  %cst_2 = arith.constant 1.0 : f32
  %t1_init = tensor.empty() : tensor<1x4x8xf32>
  %t1 = linalg.generic {indexing_maps = [#map0, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%targets : tensor<1x4xi64>)
      outs(%t1_init : tensor<1x4x8xf32>) {
  ^bb0(%in_19: i64, %out_12: f32):
    %i2_1 = linalg.index 2 : index
    %i2_i64 = arith.index_cast %i2_1 : index to i64
    %hit = arith.cmpi eq, %in_19, %i2_i64 : i64
    %elem_1 = arith.select %hit, %cst_2, %cst : f32
    linalg.yield %elem_1 : f32
  } -> tensor<1x4x8xf32>
  %picked_init = tensor.empty() : tensor<1x4x8xf32>
  %picked = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t0, %t1 : tensor<1x4x8xf32>, tensor<1x4x8xf32>)
      outs(%picked_init : tensor<1x4x8xf32>) {
  ^bb0(%in_20: f32, %in_21: f32, %out_13: f32):
    %v_14 = arith.mulf %in_20, %in_21 : f32
    linalg.yield %v_14 : f32
  } -> tensor<1x4x8xf32>
  %t2_acc_init = tensor.empty() : tensor<1x4xf32>
  %t2_acc = linalg.fill ins(%cst : f32) outs(%t2_acc_init : tensor<1x4xf32>) -> tensor<1x4xf32>
  %t2 = linalg.generic {indexing_maps = [#map1, #map0], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%picked : tensor<1x4x8xf32>)
      outs(%t2_acc : tensor<1x4xf32>) {
  ^bb0(%in_22: f32, %out_14: f32):
    %v_15 = arith.addf %in_22, %out_14 : f32
    linalg.yield %v_15 : f32
  } -> tensor<1x4xf32>
  %t3_acc_init = tensor.empty() : tensor<1xf32>
  %t3_acc = linalg.fill ins(%cst : f32) outs(%t3_acc_init : tensor<1xf32>) -> tensor<1xf32>
  %t3 = linalg.generic {indexing_maps = [#map4, #map5], iterator_types = ["parallel", "reduction"]}
      ins(%t2 : tensor<1x4xf32>)
      outs(%t3_acc : tensor<1xf32>) {
  ^bb0(%in_23: f32, %out_15: f32):
    %v_16 = arith.addf %in_23, %out_15 : f32
    linalg.yield %v_16 : f32
  } -> tensor<1xf32>
  %t4 = tensor.collapse_shape %t3 [] : tensor<1xf32> into tensor<f32>
  %t5_init = tensor.empty() : tensor<f32>
  %t5 = linalg.generic {indexing_maps = [#map8, #map8], iterator_types = []}
      ins(%t4 : tensor<f32>)
      outs(%t5_init : tensor<f32>) {
  ^bb0(%in_24: f32, %out_16: f32):
    %v_17 = arith.negf %in_24 : f32
    linalg.yield %v_17 : f32
  } -> tensor<f32>
  %cst_3 = arith.constant -1.0 : f32
  %t2.vjp.1_init = tensor.empty() : tensor<1x4x8xf32>
  %t2.vjp.1 = linalg.fill ins(%cst_3 : f32) outs(%t2.vjp.1_init : tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  %picked.vjp_init = tensor.empty() : tensor<1x4x8xf32>
  %picked.vjp = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t2.vjp.1, %t1 : tensor<1x4x8xf32>, tensor<1x4x8xf32>)
      outs(%picked.vjp_init : tensor<1x4x8xf32>) {
  ^bb0(%in_25: f32, %in_26: f32, %out_17: f32):
    %v_18 = arith.mulf %in_25, %in_26 : f32
    linalg.yield %v_18 : f32
  } -> tensor<1x4x8xf32>
  %t0.vjp_acc_init = tensor.empty() : tensor<1x4xf32>
  %t0.vjp_acc = linalg.fill ins(%cst : f32) outs(%t0.vjp_acc_init : tensor<1x4xf32>) -> tensor<1x4xf32>
  %t0.vjp = linalg.generic {indexing_maps = [#map1, #map0], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%picked.vjp : tensor<1x4x8xf32>)
      outs(%t0.vjp_acc : tensor<1x4xf32>) {
  ^bb0(%in_27: f32, %out_18: f32):
    %v_19 = arith.addf %in_27, %out_18 : f32
    linalg.yield %v_19 : f32
  } -> tensor<1x4xf32>
  %t0.vjp.1 = tensor.expand_shape %t0.vjp [[0], [1, 2]] output_shape [1, 4, 1] : tensor<1x4xf32> into tensor<1x4x1xf32>
  %t0.vjp.2_squeezed = tensor.collapse_shape %t0.vjp.1 [[0], [1, 2]] : tensor<1x4x1xf32> into tensor<1x4xf32>
  %t0.vjp.2_init = tensor.empty() : tensor<1x4x8xf32>
  %t0.vjp.2 = linalg.broadcast ins(%t0.vjp.2_squeezed : tensor<1x4xf32>) outs(%t0.vjp.2_init : tensor<1x4x8xf32>) dimensions = [2]
  %t0.vjp.3_init = tensor.empty() : tensor<1x4x8xf32>
  %t0.vjp.3 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t0 : tensor<1x4x8xf32>)
      outs(%t0.vjp.3_init : tensor<1x4x8xf32>) {
  ^bb0(%in_28: f32, %out_19: f32):
    %v_20 = math.exp %in_28 : f32
    linalg.yield %v_20 : f32
  } -> tensor<1x4x8xf32>
  %t0.vjp.4_init = tensor.empty() : tensor<1x4x8xf32>
  %t0.vjp.4 = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%t0.vjp.3, %t0.vjp.2 : tensor<1x4x8xf32>, tensor<1x4x8xf32>)
      outs(%t0.vjp.4_init : tensor<1x4x8xf32>) {
  ^bb0(%in_29: f32, %in_30: f32, %out_20: f32):
    %v_21 = arith.mulf %in_29, %in_30 : f32
    linalg.yield %v_21 : f32
  } -> tensor<1x4x8xf32>
  %t0.vjp.5_init = tensor.empty() : tensor<1x4x8xf32>
  %t0.vjp.5 = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%picked.vjp, %t0.vjp.4 : tensor<1x4x8xf32>, tensor<1x4x8xf32>)
      outs(%t0.vjp.5_init : tensor<1x4x8xf32>) {
  ^bb0(%in_31: f32, %in_32: f32, %out_21: f32):
    %v_22 = arith.subf %in_31, %in_32 : f32
    linalg.yield %v_22 : f32
  } -> tensor<1x4x8xf32>
  %storylm0_forward.t15.vjp_init = tensor.empty() : tensor<1x8x4xf32>
  %storylm0_forward.t15.vjp = linalg.transpose ins(%storylm0_forward.t14 : tensor<1x4x8xf32>) outs(%storylm0_forward.t15.vjp_init : tensor<1x8x4xf32>) permutation = [0, 2, 1]
  %storylm0_forward.t15.vjp.1_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t15.vjp.1_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t15.vjp.1_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t15.vjp.1 = linalg.batch_matmul ins(%t0.vjp.5, %storylm0_forward.t15.vjp : tensor<1x4x8xf32>, tensor<1x8x4xf32>) outs(%storylm0_forward.t15.vjp.1_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t15.vjp.2_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t15.vjp.2 = linalg.transpose ins(%storylm0_forward.h : tensor<1x4x4xf32>) outs(%storylm0_forward.t15.vjp.2_init : tensor<1x4x4xf32>) permutation = [0, 2, 1]
  %storylm0_forward.t15.vjp.3_acc_init = tensor.empty() : tensor<1x4x8xf32>
  %storylm0_forward.t15.vjp.3_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t15.vjp.3_acc_init : tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  %storylm0_forward.t15.vjp.3 = linalg.batch_matmul ins(%storylm0_forward.t15.vjp.2, %t0.vjp.5 : tensor<1x4x4xf32>, tensor<1x4x8xf32>) outs(%storylm0_forward.t15.vjp.3_acc : tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  %storylm0_forward.t14.vjp = tensor.collapse_shape %storylm0_forward.t15.vjp.3 [[0, 1], [2]] : tensor<1x4x8xf32> into tensor<4x8xf32>
  %storylm0_forward.t13.vjp_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t13.vjp = linalg.transpose ins(%storylm0_forward.t12 : tensor<1x4x4xf32>) outs(%storylm0_forward.t13.vjp_init : tensor<1x4x4xf32>) permutation = [0, 2, 1]
  %storylm0_forward.t13.vjp.1_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t13.vjp.1_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t13.vjp.1_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t13.vjp.1 = linalg.batch_matmul ins(%storylm0_forward.t15.vjp.1, %storylm0_forward.t13.vjp : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t13.vjp.1_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t13.vjp.2_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t13.vjp.2 = linalg.transpose ins(%storylm0_forward.o : tensor<1x4x4xf32>) outs(%storylm0_forward.t13.vjp.2_init : tensor<1x4x4xf32>) permutation = [0, 2, 1]
  %storylm0_forward.t13.vjp.3_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t13.vjp.3_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t13.vjp.3_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t13.vjp.3 = linalg.batch_matmul ins(%storylm0_forward.t13.vjp.2, %storylm0_forward.t15.vjp.1 : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t13.vjp.3_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t12.vjp = tensor.collapse_shape %storylm0_forward.t13.vjp.3 [[0, 1], [2]] : tensor<1x4x4xf32> into tensor<4x4xf32>
  %storylm0_forward.o.vjp = tensor.expand_shape %storylm0_forward.t13.vjp.1 [[0], [1], [2, 3]] output_shape [1, 4, 2, 2] : tensor<1x4x4xf32> into tensor<1x4x2x2xf32>
  %storylm0_forward.t11.vjp_init = tensor.empty() : tensor<1x2x4x2xf32>
  %storylm0_forward.t11.vjp = linalg.transpose ins(%storylm0_forward.o.vjp : tensor<1x4x2x2xf32>) outs(%storylm0_forward.t11.vjp_init : tensor<1x2x4x2xf32>) permutation = [0, 2, 1, 3]
  %storylm0_forward.t10.vjp_init = tensor.empty() : tensor<1x2x2x4xf32>
  %storylm0_forward.t10.vjp = linalg.transpose ins(%split_heads.t0.3 : tensor<1x4x2x2xf32>) outs(%storylm0_forward.t10.vjp_init : tensor<1x2x2x4xf32>) permutation = [0, 2, 3, 1]
  %storylm0_forward.t10.vjp.1_lhs = tensor.collapse_shape %storylm0_forward.t11.vjp [[0, 1], [2], [3]] : tensor<1x2x4x2xf32> into tensor<2x4x2xf32>
  %storylm0_forward.t10.vjp.1_rhs = tensor.collapse_shape %storylm0_forward.t10.vjp [[0, 1], [2], [3]] : tensor<1x2x2x4xf32> into tensor<2x2x4xf32>
  %storylm0_forward.t10.vjp.1_batched_acc_init = tensor.empty() : tensor<2x4x4xf32>
  %storylm0_forward.t10.vjp.1_batched_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t10.vjp.1_batched_acc_init : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %storylm0_forward.t10.vjp.1_batched = linalg.batch_matmul ins(%storylm0_forward.t10.vjp.1_lhs, %storylm0_forward.t10.vjp.1_rhs : tensor<2x4x2xf32>, tensor<2x2x4xf32>) outs(%storylm0_forward.t10.vjp.1_batched_acc : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %storylm0_forward.t10.vjp.1 = tensor.expand_shape %storylm0_forward.t10.vjp.1_batched [[0, 1], [2], [3]] output_shape [1, 2, 4, 4] : tensor<2x4x4xf32> into tensor<1x2x4x4xf32>
  %storylm0_forward.t10.vjp.2_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.t10.vjp.2 = linalg.transpose ins(%storylm0_forward.p : tensor<1x2x4x4xf32>) outs(%storylm0_forward.t10.vjp.2_init : tensor<1x2x4x4xf32>) permutation = [0, 1, 3, 2]
  %storylm0_forward.t10.vjp.3_lhs = tensor.collapse_shape %storylm0_forward.t10.vjp.2 [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32>
  %storylm0_forward.t10.vjp.3_rhs = tensor.collapse_shape %storylm0_forward.t11.vjp [[0, 1], [2], [3]] : tensor<1x2x4x2xf32> into tensor<2x4x2xf32>
  %storylm0_forward.t10.vjp.3_batched_acc_init = tensor.empty() : tensor<2x4x2xf32>
  %storylm0_forward.t10.vjp.3_batched_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t10.vjp.3_batched_acc_init : tensor<2x4x2xf32>) -> tensor<2x4x2xf32>
  %storylm0_forward.t10.vjp.3_batched = linalg.batch_matmul ins(%storylm0_forward.t10.vjp.3_lhs, %storylm0_forward.t10.vjp.3_rhs : tensor<2x4x4xf32>, tensor<2x4x2xf32>) outs(%storylm0_forward.t10.vjp.3_batched_acc : tensor<2x4x2xf32>) -> tensor<2x4x2xf32>
  %storylm0_forward.t10.vjp.3 = tensor.expand_shape %storylm0_forward.t10.vjp.3_batched [[0, 1], [2], [3]] output_shape [1, 2, 4, 2] : tensor<2x4x2xf32> into tensor<1x2x4x2xf32>
  %storylm0_forward.p.vjp_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.p.vjp = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.t10.vjp.1, %storylm0_forward.p : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>)
      outs(%storylm0_forward.p.vjp_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_33: f32, %in_34: f32, %out_22: f32):
    %v_23 = arith.mulf %in_33, %in_34 : f32
    linalg.yield %v_23 : f32
  } -> tensor<1x2x4x4xf32>
  %storylm0_forward.p.vjp.1_acc_init = tensor.empty() : tensor<1x2x4xf32>
  %storylm0_forward.p.vjp.1_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.p.vjp.1_acc_init : tensor<1x2x4xf32>) -> tensor<1x2x4xf32>
  %storylm0_forward.p.vjp.1 = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%storylm0_forward.p.vjp : tensor<1x2x4x4xf32>)
      outs(%storylm0_forward.p.vjp.1_acc : tensor<1x2x4xf32>) {
  ^bb0(%in_35: f32, %out_23: f32):
    %v_24 = arith.addf %in_35, %out_23 : f32
    linalg.yield %v_24 : f32
  } -> tensor<1x2x4xf32>
  %storylm0_forward.p.vjp.2 = tensor.expand_shape %storylm0_forward.p.vjp.1 [[0], [1], [2, 3]] output_shape [1, 2, 4, 1] : tensor<1x2x4xf32> into tensor<1x2x4x1xf32>
  %storylm0_forward.p.vjp.3_squeezed = tensor.collapse_shape %storylm0_forward.p.vjp.2 [[0], [1], [2, 3]] : tensor<1x2x4x1xf32> into tensor<1x2x4xf32>
  %storylm0_forward.p.vjp.3_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.p.vjp.3 = linalg.broadcast ins(%storylm0_forward.p.vjp.3_squeezed : tensor<1x2x4xf32>) outs(%storylm0_forward.p.vjp.3_init : tensor<1x2x4x4xf32>) dimensions = [3]
  %storylm0_forward.p.vjp.4_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.p.vjp.4 = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.t10.vjp.1, %storylm0_forward.p.vjp.3 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>)
      outs(%storylm0_forward.p.vjp.4_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_36: f32, %in_37: f32, %out_24: f32):
    %v_25 = arith.subf %in_36, %in_37 : f32
    linalg.yield %v_25 : f32
  } -> tensor<1x2x4x4xf32>
  %storylm0_forward.p.vjp.5_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.p.vjp.5 = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.p, %storylm0_forward.p.vjp.4 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>)
      outs(%storylm0_forward.p.vjp.5_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_38: f32, %in_39: f32, %out_25: f32):
    %v_26 = arith.mulf %in_38, %in_39 : f32
    linalg.yield %v_26 : f32
  } -> tensor<1x2x4x4xf32>
  %storylm0_forward.t8.vjp_init = tensor.empty() : tensor<1x2x4x4xf32>
  %storylm0_forward.t8.vjp = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.p.vjp.5, %storylm0_forward.t7 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>)
      outs(%storylm0_forward.t8.vjp_init : tensor<1x2x4x4xf32>) {
  ^bb0(%in_40: f32, %in_41: f32, %out_26: f32):
    %v_27 = arith.mulf %in_40, %in_41 : f32
    linalg.yield %v_27 : f32
  } -> tensor<1x2x4x4xf32>
  %storylm0_forward.scores.vjp.1_lhs = tensor.collapse_shape %storylm0_forward.t8.vjp [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32>
  %storylm0_forward.scores.vjp.1_rhs = tensor.collapse_shape %split_heads.t1.2 [[0, 1], [2], [3]] : tensor<1x2x4x2xf32> into tensor<2x4x2xf32>
  %storylm0_forward.scores.vjp.1_batched_acc_init = tensor.empty() : tensor<2x4x2xf32>
  %storylm0_forward.scores.vjp.1_batched_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.scores.vjp.1_batched_acc_init : tensor<2x4x2xf32>) -> tensor<2x4x2xf32>
  %storylm0_forward.scores.vjp.1_batched = linalg.batch_matmul ins(%storylm0_forward.scores.vjp.1_lhs, %storylm0_forward.scores.vjp.1_rhs : tensor<2x4x4xf32>, tensor<2x4x2xf32>) outs(%storylm0_forward.scores.vjp.1_batched_acc : tensor<2x4x2xf32>) -> tensor<2x4x2xf32>
  %storylm0_forward.scores.vjp.1 = tensor.expand_shape %storylm0_forward.scores.vjp.1_batched [[0, 1], [2], [3]] output_shape [1, 2, 4, 2] : tensor<2x4x2xf32> into tensor<1x2x4x2xf32>
  %storylm0_forward.scores.vjp.2_init = tensor.empty() : tensor<1x2x2x4xf32>
  %storylm0_forward.scores.vjp.2 = linalg.transpose ins(%split_heads.t0 : tensor<1x4x2x2xf32>) outs(%storylm0_forward.scores.vjp.2_init : tensor<1x2x2x4xf32>) permutation = [0, 2, 3, 1]
  %storylm0_forward.scores.vjp.3_lhs = tensor.collapse_shape %storylm0_forward.scores.vjp.2 [[0, 1], [2], [3]] : tensor<1x2x2x4xf32> into tensor<2x2x4xf32>
  %storylm0_forward.scores.vjp.3_rhs = tensor.collapse_shape %storylm0_forward.t8.vjp [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32>
  %storylm0_forward.scores.vjp.3_batched_acc_init = tensor.empty() : tensor<2x2x4xf32>
  %storylm0_forward.scores.vjp.3_batched_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.scores.vjp.3_batched_acc_init : tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
  %storylm0_forward.scores.vjp.3_batched = linalg.batch_matmul ins(%storylm0_forward.scores.vjp.3_lhs, %storylm0_forward.scores.vjp.3_rhs : tensor<2x2x4xf32>, tensor<2x4x4xf32>) outs(%storylm0_forward.scores.vjp.3_batched_acc : tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
  %storylm0_forward.scores.vjp.3 = tensor.expand_shape %storylm0_forward.scores.vjp.3_batched [[0, 1], [2], [3]] output_shape [1, 2, 2, 4] : tensor<2x2x4xf32> into tensor<1x2x2x4xf32>
  %split_heads.t1.4.vjp_init = tensor.empty() : tensor<1x4x2x2xf32>
  %split_heads.t1.4.vjp = linalg.transpose ins(%storylm0_forward.t10.vjp.3 : tensor<1x2x4x2xf32>) outs(%split_heads.t1.4.vjp_init : tensor<1x4x2x2xf32>) permutation = [0, 2, 1, 3]
  %split_heads.t0.3.vjp = tensor.collapse_shape %split_heads.t1.4.vjp [[0], [1], [2, 3]] : tensor<1x4x2x2xf32> into tensor<1x4x4xf32>
  %storylm0_forward.t5.vjp_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t5.vjp = linalg.transpose ins(%storylm0_forward.t4 : tensor<1x4x4xf32>) outs(%storylm0_forward.t5.vjp_init : tensor<1x4x4xf32>) permutation = [0, 2, 1]
  %storylm0_forward.t5.vjp.1_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t5.vjp.1_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t5.vjp.1_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t5.vjp.1 = linalg.batch_matmul ins(%split_heads.t0.3.vjp, %storylm0_forward.t5.vjp : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t5.vjp.1_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t5.vjp.2_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t5.vjp.2 = linalg.transpose ins(%storylm0_forward.x : tensor<1x4x4xf32>) outs(%storylm0_forward.t5.vjp.2_init : tensor<1x4x4xf32>) permutation = [0, 2, 1]
  %storylm0_forward.t5.vjp.3_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t5.vjp.3_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t5.vjp.3_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t5.vjp.3 = linalg.batch_matmul ins(%storylm0_forward.t5.vjp.2, %split_heads.t0.3.vjp : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t5.vjp.3_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.x.ct_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.x.ct = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.t15.vjp.1, %storylm0_forward.t5.vjp.1 : tensor<1x4x4xf32>, tensor<1x4x4xf32>)
      outs(%storylm0_forward.x.ct_init : tensor<1x4x4xf32>) {
  ^bb0(%in_42: f32, %in_43: f32, %out_27: f32):
    %v_28 = arith.addf %in_42, %in_43 : f32
    linalg.yield %v_28 : f32
  } -> tensor<1x4x4xf32>
  %storylm0_forward.t4.vjp = tensor.collapse_shape %storylm0_forward.t5.vjp.3 [[0, 1], [2]] : tensor<1x4x4xf32> into tensor<4x4xf32>
  %split_heads.t1.2.vjp_init = tensor.empty() : tensor<1x4x2x2xf32>
  %split_heads.t1.2.vjp = linalg.transpose ins(%storylm0_forward.scores.vjp.3 : tensor<1x2x2x4xf32>) outs(%split_heads.t1.2.vjp_init : tensor<1x4x2x2xf32>) permutation = [0, 3, 1, 2]
  %split_heads.t0.1.vjp = tensor.collapse_shape %split_heads.t1.2.vjp [[0], [1], [2, 3]] : tensor<1x4x2x2xf32> into tensor<1x4x4xf32>
  %storylm0_forward.t3.vjp_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t3.vjp = linalg.transpose ins(%storylm0_forward.t2 : tensor<1x4x4xf32>) outs(%storylm0_forward.t3.vjp_init : tensor<1x4x4xf32>) permutation = [0, 2, 1]
  %storylm0_forward.t3.vjp.1_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t3.vjp.1_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t3.vjp.1_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t3.vjp.1 = linalg.batch_matmul ins(%split_heads.t0.1.vjp, %storylm0_forward.t3.vjp : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t3.vjp.1_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t3.vjp.3_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t3.vjp.3_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t3.vjp.3_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t3.vjp.3 = linalg.batch_matmul ins(%storylm0_forward.t5.vjp.2, %split_heads.t0.1.vjp : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t3.vjp.3_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.x.ct.1_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.x.ct.1 = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.x.ct, %storylm0_forward.t3.vjp.1 : tensor<1x4x4xf32>, tensor<1x4x4xf32>)
      outs(%storylm0_forward.x.ct.1_init : tensor<1x4x4xf32>) {
  ^bb0(%in_44: f32, %in_45: f32, %out_28: f32):
    %v_29 = arith.addf %in_44, %in_45 : f32
    linalg.yield %v_29 : f32
  } -> tensor<1x4x4xf32>
  %storylm0_forward.t2.vjp = tensor.collapse_shape %storylm0_forward.t3.vjp.3 [[0, 1], [2]] : tensor<1x4x4xf32> into tensor<4x4xf32>
  %split_heads.t1.vjp_init = tensor.empty() : tensor<1x4x2x2xf32>
  %split_heads.t1.vjp = linalg.transpose ins(%storylm0_forward.scores.vjp.1 : tensor<1x2x4x2xf32>) outs(%split_heads.t1.vjp_init : tensor<1x4x2x2xf32>) permutation = [0, 2, 1, 3]
  %split_heads.t0.vjp = tensor.collapse_shape %split_heads.t1.vjp [[0], [1], [2, 3]] : tensor<1x4x2x2xf32> into tensor<1x4x4xf32>
  %storylm0_forward.t1.vjp_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t1.vjp = linalg.transpose ins(%storylm0_forward.t0 : tensor<1x4x4xf32>) outs(%storylm0_forward.t1.vjp_init : tensor<1x4x4xf32>) permutation = [0, 2, 1]
  %storylm0_forward.t1.vjp.1_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t1.vjp.1_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t1.vjp.1_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t1.vjp.1 = linalg.batch_matmul ins(%split_heads.t0.vjp, %storylm0_forward.t1.vjp : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t1.vjp.1_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t1.vjp.3_acc_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.t1.vjp.3_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.t1.vjp.3_acc_init : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.t1.vjp.3 = linalg.batch_matmul ins(%storylm0_forward.t5.vjp.2, %split_heads.t0.vjp : tensor<1x4x4xf32>, tensor<1x4x4xf32>) outs(%storylm0_forward.t1.vjp.3_acc : tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %storylm0_forward.x.ct.2_init = tensor.empty() : tensor<1x4x4xf32>
  %storylm0_forward.x.ct.2 = linalg.generic {indexing_maps = [#map1, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%storylm0_forward.x.ct.1, %storylm0_forward.t1.vjp.1 : tensor<1x4x4xf32>, tensor<1x4x4xf32>)
      outs(%storylm0_forward.x.ct.2_init : tensor<1x4x4xf32>) {
  ^bb0(%in_46: f32, %in_47: f32, %out_29: f32):
    %v_30 = arith.addf %in_46, %in_47 : f32
    linalg.yield %v_30 : f32
  } -> tensor<1x4x4xf32>
  %storylm0_forward.t0.vjp = tensor.collapse_shape %storylm0_forward.t1.vjp.3 [[0, 1], [2]] : tensor<1x4x4xf32> into tensor<4x4xf32>
  %storylm0_forward.x.vjp_acc_init = tensor.empty() : tensor<8x4xf32>
  %storylm0_forward.x.vjp_acc = linalg.fill ins(%cst : f32) outs(%storylm0_forward.x.vjp_acc_init : tensor<8x4xf32>) -> tensor<8x4xf32>
  %storylm0_forward.x.vjp = linalg.generic {indexing_maps = [#map9, #map10, #map11], iterator_types = ["parallel", "parallel", "reduction", "reduction"]}
      ins(%storylm0_forward.x.ct.2, %token_ids : tensor<1x4x4xf32>, tensor<1x4xi64>)
      outs(%storylm0_forward.x.vjp_acc : tensor<8x4xf32>) {
  ^bb0(%in_48: f32, %in_49: i64, %out_30: f32):
    %i0 = linalg.index 0 : index
    %r = arith.index_cast %i0 : index to i64
    %hit_1 = arith.cmpi eq, %in_49, %r : i64
    %added = arith.addf %out_30, %in_48 : f32
    %total = arith.select %hit_1, %added, %out_30 : f32
    linalg.yield %total : f32
  } -> tensor<8x4xf32>
  return %t5, %storylm0_forward.x.vjp, %storylm0_forward.t0.vjp, %storylm0_forward.t2.vjp, %storylm0_forward.t4.vjp, %storylm0_forward.t12.vjp, %storylm0_forward.t14.vjp : tensor<f32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>
}

func.func @storylm0_nll_step(%token_ids: tensor<1x4xi64>, %targets: tensor<1x4xi64>, %embed: tensor<8x4xf32>, %wq: tensor<4x4xf32>, %wk: tensor<4x4xf32>, %wv: tensor<4x4xf32>, %wo: tensor<4x4xf32>, %lm_head: tensor<4x8xf32>, %causal_mask: tensor<1x1x4x4xf32>, %scale: tensor<1x1x1x1xf32>, %lr: tensor<1x1xf32>) -> (tensor<f32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>) {
  %nll, %g_embed, %g_wq, %g_wk, %g_wv, %g_wo, %g_lm_head = func.call @storylm0_nll__grad_2_3_4_5_6_7(%token_ids, %targets, %embed, %wq, %wk, %wv, %wo, %lm_head, %causal_mask, %scale) : (tensor<1x4xi64>, tensor<1x4xi64>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>, tensor<1x1x4x4xf32>, tensor<1x1x1x1xf32>) -> (tensor<f32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>)
  %t0_squeezed = tensor.collapse_shape %lr [] : tensor<1x1xf32> into tensor<f32>
  %t0_init = tensor.empty() : tensor<8x4xf32>
  %t0 = linalg.broadcast ins(%t0_squeezed : tensor<f32>) outs(%t0_init : tensor<8x4xf32>) dimensions = [0, 1]
  %t1_init = tensor.empty() : tensor<8x4xf32>
  %t1 = linalg.generic {indexing_maps = [#map4, #map4, #map4], iterator_types = ["parallel", "parallel"]}
      ins(%t0, %g_embed : tensor<8x4xf32>, tensor<8x4xf32>)
      outs(%t1_init : tensor<8x4xf32>) {
  ^bb0(%in: f32, %in_1: f32, %out: f32):
    %v = arith.mulf %in, %in_1 : f32
    linalg.yield %v : f32
  } -> tensor<8x4xf32>
  %embed_next_init = tensor.empty() : tensor<8x4xf32>
  %embed_next = linalg.generic {indexing_maps = [#map4, #map4, #map4], iterator_types = ["parallel", "parallel"]}
      ins(%embed, %t1 : tensor<8x4xf32>, tensor<8x4xf32>)
      outs(%embed_next_init : tensor<8x4xf32>) {
  ^bb0(%in_2: f32, %in_3: f32, %out_1: f32):
    %v_1 = arith.subf %in_2, %in_3 : f32
    linalg.yield %v_1 : f32
  } -> tensor<8x4xf32>
  %t2_squeezed = tensor.collapse_shape %lr [] : tensor<1x1xf32> into tensor<f32>
  %t2_init = tensor.empty() : tensor<4x8xf32>
  %t2 = linalg.broadcast ins(%t2_squeezed : tensor<f32>) outs(%t2_init : tensor<4x8xf32>) dimensions = [0, 1]
  %t3_init = tensor.empty() : tensor<4x8xf32>
  %t3 = linalg.generic {indexing_maps = [#map4, #map4, #map4], iterator_types = ["parallel", "parallel"]}
      ins(%t2, %g_lm_head : tensor<4x8xf32>, tensor<4x8xf32>)
      outs(%t3_init : tensor<4x8xf32>) {
  ^bb0(%in_4: f32, %in_5: f32, %out_2: f32):
    %v_2 = arith.mulf %in_4, %in_5 : f32
    linalg.yield %v_2 : f32
  } -> tensor<4x8xf32>
  %lm_head_next_init = tensor.empty() : tensor<4x8xf32>
  %lm_head_next = linalg.generic {indexing_maps = [#map4, #map4, #map4], iterator_types = ["parallel", "parallel"]}
      ins(%lm_head, %t3 : tensor<4x8xf32>, tensor<4x8xf32>)
      outs(%lm_head_next_init : tensor<4x8xf32>) {
  ^bb0(%in_6: f32, %in_7: f32, %out_3: f32):
    %v_3 = arith.subf %in_6, %in_7 : f32
    linalg.yield %v_3 : f32
  } -> tensor<4x8xf32>
  %t4 = func.call @sgd_dd(%wq, %g_wq, %lr) : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<1x1xf32>) -> (tensor<4x4xf32>)
  %t5 = func.call @sgd_dd(%wk, %g_wk, %lr) : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<1x1xf32>) -> (tensor<4x4xf32>)
  %t6 = func.call @sgd_dd(%wv, %g_wv, %lr) : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<1x1xf32>) -> (tensor<4x4xf32>)
  %t7 = func.call @sgd_dd(%wo, %g_wo, %lr) : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<1x1xf32>) -> (tensor<4x4xf32>)
  return %nll, %embed_next, %t4, %t5, %t6, %t7, %lm_head_next : tensor<f32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>
}

func.func @main(%ids: tensor<1x4xi64>, %targets: tensor<1x4xi64>, %embed: tensor<8x4xf32>, %wq: tensor<4x4xf32>, %wk: tensor<4x4xf32>, %wv: tensor<4x4xf32>, %wo: tensor<4x4xf32>, %lm_head: tensor<4x8xf32>, %mask: tensor<1x1x4x4xf32>, %scale: tensor<1x1x1x1xf32>, %lr: tensor<1x1xf32>) -> (tensor<f32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>) {
  %nll, %embed2, %wq2, %wk2, %wv2, %wo2, %lm_head2 = func.call @storylm0_nll_step(%ids, %targets, %embed, %wq, %wk, %wv, %wo, %lm_head, %mask, %scale, %lr) : (tensor<1x4xi64>, tensor<1x4xi64>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>, tensor<1x1x4x4xf32>, tensor<1x1x1x1xf32>, tensor<1x1xf32>) -> (tensor<f32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>)
  return %nll, %embed2, %wq2, %wk2, %wv2, %wo2, %lm_head2 : tensor<f32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>
}
