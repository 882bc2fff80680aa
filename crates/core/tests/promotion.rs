//! MLX promotion table, one test per cell. Expected values were read from mlx.core 0.32.4:
//! `(mx.zeros(1, dtype=a) + mx.zeros(1, dtype=b)).dtype`.

use mlxcel_core::dtype::{promote, DType::*, Promotion, PromotionPolicy};

macro_rules! cell {
    ($name:ident, $a:expr, $b:expr, $want:expr) => {
        #[test]
        fn $name() {
            assert_eq!(promote($a, $b, PromotionPolicy::default()), $want);
        }
    };
}

cell!(bool_bool, Bool, Bool, Promotion::To(Bool));
cell!(bool_u8, Bool, U8, Promotion::To(U8));
cell!(bool_u32, Bool, U32, Promotion::To(U32));
cell!(bool_i32, Bool, I32, Promotion::To(I32));
cell!(bool_f16, Bool, F16, Promotion::To(F16));
cell!(bool_bf16, Bool, BF16, Promotion::To(BF16));
cell!(bool_f32, Bool, F32, Promotion::To(F32));
cell!(u8_bool, U8, Bool, Promotion::To(U8));
cell!(u8_u8, U8, U8, Promotion::To(U8));
cell!(u8_u32, U8, U32, Promotion::To(U32));
cell!(u8_i32, U8, I32, Promotion::To(I32));
cell!(u8_f16, U8, F16, Promotion::To(F16));
cell!(u8_bf16, U8, BF16, Promotion::To(BF16));
cell!(u8_f32, U8, F32, Promotion::To(F32));
cell!(u32_bool, U32, Bool, Promotion::To(U32));
cell!(u32_u8, U32, U8, Promotion::To(U32));
cell!(u32_u32, U32, U32, Promotion::To(U32));
cell!(u32_i32, U32, I32, Promotion::Unsupported("int64"));
cell!(u32_f16, U32, F16, Promotion::To(F16));
cell!(u32_bf16, U32, BF16, Promotion::To(BF16));
cell!(u32_f32, U32, F32, Promotion::To(F32));
cell!(i32_bool, I32, Bool, Promotion::To(I32));
cell!(i32_u8, I32, U8, Promotion::To(I32));
cell!(i32_u32, I32, U32, Promotion::Unsupported("int64"));
cell!(i32_i32, I32, I32, Promotion::To(I32));
cell!(i32_f16, I32, F16, Promotion::To(F16));
cell!(i32_bf16, I32, BF16, Promotion::To(BF16));
cell!(i32_f32, I32, F32, Promotion::To(F32));
cell!(f16_bool, F16, Bool, Promotion::To(F16));
cell!(f16_u8, F16, U8, Promotion::To(F16));
cell!(f16_u32, F16, U32, Promotion::To(F16));
cell!(f16_i32, F16, I32, Promotion::To(F16));
cell!(f16_f16, F16, F16, Promotion::To(F16));
cell!(f16_bf16, F16, BF16, Promotion::To(F32));
cell!(f16_f32, F16, F32, Promotion::To(F32));
cell!(bf16_bool, BF16, Bool, Promotion::To(BF16));
cell!(bf16_u8, BF16, U8, Promotion::To(BF16));
cell!(bf16_u32, BF16, U32, Promotion::To(BF16));
cell!(bf16_i32, BF16, I32, Promotion::To(BF16));
cell!(bf16_f16, BF16, F16, Promotion::To(F32));
cell!(bf16_bf16, BF16, BF16, Promotion::To(BF16));
cell!(bf16_f32, BF16, F32, Promotion::To(F32));
cell!(f32_bool, F32, Bool, Promotion::To(F32));
cell!(f32_u8, F32, U8, Promotion::To(F32));
cell!(f32_u32, F32, U32, Promotion::To(F32));
cell!(f32_i32, F32, I32, Promotion::To(F32));
cell!(f32_f16, F32, F16, Promotion::To(F32));
cell!(f32_bf16, F32, BF16, Promotion::To(F32));
cell!(f32_f32, F32, F32, Promotion::To(F32));

#[test]
fn bf16_policy_keeps_bf16_with_f32() {
    let p = PromotionPolicy {
        bf16_wins_over_f32: true,
    };
    assert_eq!(promote(BF16, F32, p), Promotion::To(BF16));
    assert_eq!(promote(F32, BF16, p), Promotion::To(BF16));
    // Only that pair changes.
    assert_eq!(promote(F16, F32, p), Promotion::To(F32));
    assert_eq!(promote(F16, BF16, p), Promotion::To(F32));
}

#[test]
fn table_is_symmetric() {
    for a in mlxcel_core::DType::ALL {
        for b in mlxcel_core::DType::ALL {
            assert_eq!(
                promote(a, b, PromotionPolicy::default()),
                promote(b, a, PromotionPolicy::default())
            );
        }
    }
}
