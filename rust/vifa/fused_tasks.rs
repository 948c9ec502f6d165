//! Task drivers of the fused kernels (K ≤ `fused::MAX_K`): a task walks its rows block by block
//! (`BLOCK_ROWS` rows, the engine's partition), regenerates the draws' noise z and widens the gradients
//! to f64 for the block, and runs the kernel. Buffers are allocated once per task, never per block.

use ndarray::s;

use super::fill_noise;
use super::fused::{run_gram_block, run_norms_block, run_update_block, StepConsts};
use super::gradient::GradCtx;
use super::lanes::Draws;
use super::params::Params;
use super::update::StepTask;
use crate::engine::isa::Isa;
use crate::engine::BLOCK_ROWS;
use crate::scalar::Real;

/// g and z of every pending draw for one block: draw l's values start at l · `BLOCK_ROWS`.
struct DrawBlock {
    g: Vec<f64>,
    z: Vec<f64>,
}

impl DrawBlock {
    fn new(n_draws: usize) -> Self {
        DrawBlock {
            g: vec![0.0; n_draws * BLOCK_ROWS],
            z: vec![0.0; n_draws * BLOCK_ROWS],
        }
    }

    /// The draws of this model's rows row0 … row0 + nb − 1 (`h`: the L×K latent draws, row-major).
    fn fill<'a, X: Real>(&'a mut self, ctx: &GradCtx<'_, X>, h: &'a [f64], row0: usize, nb: usize) -> Draws<'a> {
        let n_draws = ctx.grads.nrows();
        for l in 0..n_draws {
            let span = l * BLOCK_ROWS..l * BLOCK_ROWS + nb;
            let src = ctx.grads.row(l);
            for (dst, src) in self.g[span.clone()].iter_mut().zip(src.slice(s![row0..row0 + nb])) {
                *dst = src.to_f64();
            }
            let draw = ctx.first_draw + l as u64;
            fill_noise(ctx.seed, draw, ctx.row_offset + row0, &mut self.z[span]);
        }
        Draws {
            g: &self.g,
            z: &self.z,
            h,
            n_draws,
            stride: BLOCK_ROWS,
        }
    }
}

/// One step on a task's rows; returns its share of B (K×K row-major) and whether every new value is
/// finite. `h`: the L×K latent draws (row-major).
pub(super) fn update_task<T: Real, X: Real>(
    isa: Isa,
    task: StepTask<'_, T>,
    ctx: &GradCtx<'_, X>,
    h: &[f64],
    consts: &StepConsts<'_>,
) -> (Vec<f64>, bool) {
    let k = ctx.k;
    let StepTask {
        lo,
        mut p,
        sqrt_psi,
        mut m,
    } = task;
    let n = p.c.len();
    let mut draws = DrawBlock::new(ctx.grads.nrows());
    let mut gram = vec![0.0; k * k];
    let mut finite = true;
    for b0 in (0..n).step_by(BLOCK_ROWS) {
        let nb = (n - b0).min(BLOCK_ROWS);
        let d = draws.fill(ctx, h, lo + b0, nb);
        let mut rows = p.block(k, b0, nb);
        let mut moments = m.as_mut().map(|(a, b)| (a.block(k, b0, nb), b.block(k, b0, nb)));
        let sp = &mut sqrt_psi[b0..b0 + nb];
        finite &= run_update_block(isa, &mut rows, sp, moments.as_mut(), &d, consts, &mut gram);
    }
    (gram, finite)
}

/// ‖∇_c‖², ‖∇_F‖², ‖∇_β‖² over rows lo … hi − 1 (read-only).
#[allow(clippy::too_many_arguments)]
pub(super) fn norms_task<T: Real, X: Real>(
    isa: Isa,
    params: &Params<T>,
    sqrt_psi: &[f64],
    (lo, hi): (usize, usize),
    ctx: &GradCtx<'_, X>,
    h: &[f64],
    m_inv: &[f64],
) -> [f64; 3] {
    let k = ctx.k;
    let mut draws = DrawBlock::new(ctx.grads.nrows());
    let mut sq = [0.0; 3];
    for b0 in (lo..hi).step_by(BLOCK_ROWS) {
        let nb = (hi - b0).min(BLOCK_ROWS);
        let d = draws.fill(ctx, h, b0, nb);
        let rows = (
            &params.c[b0..b0 + nb],
            &params.f[b0 * k..(b0 + nb) * k],
            &params.beta[b0..b0 + nb],
        );
        let part = run_norms_block(isa, k, rows, &sqrt_psi[b0..b0 + nb], &d, m_inv, ctx.alpha);
        for (total, v) in sq.iter_mut().zip(part) {
            *total += v;
        }
    }
    sq
}

/// B = Fᵀ Ψ⁻¹ F over rows lo … hi − 1 from the stored F and ψ^{1/2} (K×K row-major).
pub(super) fn gram_task<T: Real>(
    isa: Isa,
    k: usize,
    params: &Params<T>,
    sqrt_psi: &[f64],
    (lo, hi): (usize, usize),
) -> Vec<f64> {
    let mut gram = vec![0.0; k * k];
    for b0 in (lo..hi).step_by(BLOCK_ROWS) {
        let nb = (hi - b0).min(BLOCK_ROWS);
        run_gram_block(
            isa,
            k,
            &params.f[b0 * k..(b0 + nb) * k],
            &sqrt_psi[b0..b0 + nb],
            &mut gram,
        );
    }
    gram
}
