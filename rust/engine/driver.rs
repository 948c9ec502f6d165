//! The one update driver of the streaming models: the batch validated before any row, the scratch of the call,
//! the row loop, and the policies that leave a model as it was when a row fails. The models differ in their
//! step and in how a large model (no whole-model copy) undoes a failed row; those are the hooks of [`Driven`].
//!
//! Failure policy, for a batch x (n×D) of a model of D·K state elements:
//! * D·K ≤ `SNAPSHOT_MAX_ELEMENTS`: the model is copied before the first row and restored if any row fails,
//!   so a failed call applies nothing;
//! * larger models: a failed row is undone by the model's own hooks (the rows before it stay applied), and a
//!   model whose pass reads its row more than once ([`Driven::PRIVATE_ROWS`]) reads a private copy, validated
//!   again, so that another thread writing to the caller's array between the validation and the pass cannot
//!   slip an unchecked value in;
//! * a failed step in float32 arithmetic is redone once in float64 arithmetic by models that have both
//!   ([`Driven::RETRY_IN_F64`]): near the float32 range the kernels' float32 arithmetic can overflow where the
//!   f64 block path does not.

use ndarray::{ArrayView1, ArrayView2, Axis};

use super::model::hooks::Pass;
use super::model::StepSums;
use super::partition::{validate_batch, Scratch, SNAPSHOT_MAX_ELEMENTS};
use crate::error::Result;
use crate::scalar::Real;

/// The hooks a streaming model gives the driver.
pub(crate) trait Driven: Pass + Clone {
    /// The storage type of the state.
    type Storage: Real;
    /// Buffers the model keeps across calls (taken for the length of a call).
    type Reused;
    /// What a large model needs to undo a failed row.
    type RowUndo;
    /// Whether a large model reads each row from a private, validated float64 copy.
    const PRIVATE_ROWS: bool;
    /// Whether a failed float32-arithmetic step is redone once in float64 arithmetic.
    const RETRY_IN_F64: bool;

    /// One sample: the pass over every row, then the K×K step (which may fail). `kernels` false: the block path
    /// in float64 arithmetic.
    fn try_step<X: Real>(
        &mut self,
        x: ArrayView1<X>,
        scratch: &mut Scratch,
        sums: &mut StepSums,
        kernels: bool,
    ) -> Result<()>;
    /// Take the buffers kept across calls (for the length of a call).
    fn take_reused(&mut self) -> Self::Reused;
    /// Give the buffers back after a call.
    fn put_reused(&mut self, reused: Self::Reused);
    /// The private row copy inside the buffers (used when [`Driven::PRIVATE_ROWS`]).
    fn row_copy(reused: &mut Self::Reused) -> &mut Vec<f64>;
    /// Before a row of a large model: record what [`Driven::undo_row`] needs.
    fn prepare_undo(&mut self, reused: &mut Self::Reused) -> Self::RowUndo;
    /// After a failed row of a large model (its pending step already dropped): return to the model before it.
    fn undo_row(&mut self, undo: Self::RowUndo, reused: &Self::Reused);
}

/// Apply the rows of `x` (n×D) to `model` in order, with the failure policy of this module.
pub(crate) fn update<M: Driven, X: Real>(model: &mut M, x: ArrayView2<X>) -> Result<()> {
    validate_batch::<M::Storage, X>(&x, model.dims().0)?;
    let mut reused = model.take_reused();
    let result = update_rows(model, x, &mut reused);
    model.put_reused(reused);
    result
}

fn update_rows<M: Driven, X: Real>(model: &mut M, x: ArrayView2<X>, reused: &mut M::Reused) -> Result<()> {
    let (d, k) = model.dims();
    let mut scratch = Scratch::new(d, k);
    let mut sums = StepSums::zeros(k);
    let backup = (d * k <= SNAPSHOT_MAX_ELEMENTS).then(|| model.clone());
    for row in x.rows() {
        let result = match backup {
            Some(_) => step(model, row, &mut scratch, &mut sums),
            None => step_undoable(model, row, &mut scratch, &mut sums, reused),
        };
        if let Err(err) = result {
            if let Some(previous) = backup {
                *model = previous;
            }
            return Err(err);
        }
    }
    Ok(())
}

/// One row of a model with no whole-model copy: the private row copy and the model's undo hooks.
fn step_undoable<M: Driven, X: Real>(
    model: &mut M,
    row: ArrayView1<X>,
    scratch: &mut Scratch,
    sums: &mut StepSums,
    reused: &mut M::Reused,
) -> Result<()> {
    if M::PRIVATE_ROWS {
        let copy = M::row_copy(reused);
        copy.clear();
        copy.extend(row.iter().map(|v| v.to_f64()));
        validate_batch::<M::Storage, f64>(&ArrayView1::from(&copy[..]).insert_axis(Axis(0)), model.dims().0)?;
    }
    let undo = model.prepare_undo(reused);
    let result = if M::PRIVATE_ROWS {
        step(model, ArrayView1::from(&M::row_copy(reused)[..]), scratch, sums)
    } else {
        step(model, row, scratch, sums)
    };
    if result.is_err() {
        model.undo_row(undo, reused);
    }
    result
}

/// One sample, with the float64 retry of a failed float32-arithmetic step. A failed step drops the pending
/// step its pass consumed, which leaves the model the one before the sample (see each model's `try_step`).
fn step<M: Driven, X: Real>(model: &mut M, x: ArrayView1<X>, scratch: &mut Scratch, sums: &mut StepSums) -> Result<()> {
    let mut result = model.try_step(x, scratch, sums, true);
    if result.is_err() {
        model.drop_pending();
        if M::RETRY_IN_F64 && M::Storage::SINGLE {
            result = model.try_step(x, scratch, sums, false);
            if result.is_err() {
                model.drop_pending();
            }
        }
    }
    result
}
